"""``python -m clkernels [SPEC]``: list every OpenCL device and mark the one chosen.

``python -m clkernels cache [--clear]``: where the program binary cache is, its size and entries,
and the launch shapes chosen by measuring (``--clear`` empties it).
``python -m clkernels warmup [--device SPEC] [--what bal,colmap,vision]``: build the standard
kernels into that cache ahead of time (for images and containers), with the time per program.
"""
import argparse
import sys

from .runtime import DeviceNotFoundError, NoPlatformError, describe_devices, list_devices, select_device


def _devices(argv) -> int:
    try:
        devices = list_devices()
        chosen, reason = select_device(argv[0] if argv else None)
    except (NoPlatformError, DeviceNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(describe_devices(devices, mark=chosen))
    print(f"\nchosen: {chosen.name.strip()} on {chosen.platform.name.strip()} -- {reason}")
    return 0


def _cache(argv) -> int:
    from . import cache
    p = argparse.ArgumentParser(prog="python -m clkernels cache", description="the program binary cache")
    p.add_argument("--clear", action="store_true", help="remove every entry")
    args = p.parse_args(argv)
    where = cache.cache_dir()
    if args.clear:
        print(f"removed {cache.clear()} files from {where}")
        return 0
    entries = cache.entries()
    print(f"cache: {where} (set {cache.ENV} to move it)")
    print(f"size: {cache.size_bytes() / 2**20:.1f} MiB in {len(entries)} programs")
    for e in entries:
        if "error" in e:
            print(f"  {e['bytes']:9d} B  unreadable: {e['error']} ({e['path']})")
            continue
        device = e["device"].split(" | ")
        print(f"  {e['bytes']:9d} B  {e['created']}  {e['name'] or '-':38s} {device[3]} ({device[0]}, driver "
              f"{device[-1]})  kernels: {e['kernels']}")
    tuned = cache.tunings()
    if tuned:
        print(f"launch shapes chosen by measuring (clkernels.autotune): {len(tuned)}")
        for t in tuned:
            if "error" in t:
                print(f"  unreadable: {t['error']} ({t['path']})")
                continue
            choice = ", ".join(f"{k}={v}" for k, v in t["choice"].items() if v not in (0, False, ""))
            print(f"  {t.get('created', '?')}  {t.get('what', '?')} on {t['identity'].split(' | ')[3]}: {choice}")
    return 0


def _warmup(argv) -> int:
    from . import warmup
    p = argparse.ArgumentParser(prog="python -m clkernels warmup", description=warmup.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="OpenCL device spec (default: PYCLAD_DEVICE or the default device)")
    p.add_argument("--what", default="bal,colmap,vision", help=f"comma-separated, of {', '.join(warmup.RECIPES)}")
    args = p.parse_args(argv)
    what = [w.strip() for w in args.what.split(",") if w.strip()]
    unknown = [w for w in what if w not in warmup.RECIPES]
    if unknown:
        p.error(f"--what {','.join(unknown)}: choose from {', '.join(warmup.RECIPES)}")
    try:
        warmup.run(args.device, what)
    except (NoPlatformError, DeviceNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    commands = {"cache": _cache, "warmup": _warmup}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    return _devices(argv)


if __name__ == "__main__":
    sys.exit(main())
