"""``python -m clkernels [SPEC]``: list every OpenCL device and mark the one chosen."""
import sys

from .runtime import DeviceNotFoundError, NoPlatformError, describe_devices, list_devices, select_device


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        devices = list_devices()
        chosen, reason = select_device(argv[0] if argv else None)
    except (NoPlatformError, DeviceNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(describe_devices(devices, mark=chosen))
    print(f"\nchosen: {chosen.name.strip()} on {chosen.platform.name.strip()} -- {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
