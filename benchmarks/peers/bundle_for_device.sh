#!/usr/bin/env bash
# Makes a self-contained copy of the Ceres peer programs for a machine that has no Ceres and no
# network (the GPU machine): both programs, every shared library they load (Ceres, glog, gflags,
# SuiteSparse/CHOLMOD, BLAS/LAPACK, METIS, libgomp, libstdc++ ... and glibc with its loader, so
# the host's glibc version does not matter) and a `run` wrapper.
#
#   benchmarks/peers/bundle_for_device.sh [DEST]        (DEST defaults to <repo>/.peers)
#
# Layout: DEST/bin/{ceres_jacobian,ceres_bundle_adjuster}, DEST/lib/*.so*, DEST/run, DEST/MANIFEST.txt.
# Use there:  PYCLAD_CERES_PEERS=.peers python3 benchmarks/ceres_peer.py throughput
#        or:  .peers/run ceres_bundle_adjuster --input=problem.txt
# /.peers/ is added to .git/info/exclude (not .gitignore): it is a local artefact to carry, never committed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
dest=${1:-$root/.peers}
limit_mib=40
loader_name=ld-linux-x86-64.so.2

[ "$(uname -m)" = x86_64 ] || { echo "bundle_for_device.sh: only x86-64 is supported" >&2; exit 2; }
python3 "$root/benchmarks/ceres_peer.py" build >/dev/null
build=$root/benchmarks/peers/build
programs=(ceres_jacobian ceres_bundle_adjuster)

# everything but cuda/ (the CUDA peers' sources that stage_cuda_peers.sh puts beside the bundle)
mkdir -p "$dest"
find "$dest" -mindepth 1 -maxdepth 1 ! -name cuda -exec rm -rf {} +
mkdir -p "$dest/bin" "$dest/lib"
for p in "${programs[@]}"; do
  cp "$build/$p" "$dest/bin/$p"
  strip --strip-unneeded "$dest/bin/$p" 2>/dev/null || true
done

# Every library ldd resolves for either program (soname => path), copied under its soname;
# and the program interpreter (the glibc loader), which ldd lists without "=>".
loader=
while read -r line; do
  case "$line" in
    *"=> not found"*) echo "bundle_for_device.sh: unresolved library: $line" >&2; exit 1 ;;
    *"=>"*)
      name=$(echo "$line" | awk '{print $1}'); path=$(echo "$line" | awk '{print $3}')
      if [ -n "$path" ] && [ ! -e "$dest/lib/$name" ]; then
        cp -L "$path" "$dest/lib/$name"; echo "$name $path" >> "$dest/.sources"
      fi ;;
    */ld-linux*) loader=$(echo "$line" | awk '{print $1}'); echo "$loader_name $loader" >> "$dest/.sources" ;;
  esac
done < <(for p in "${programs[@]}"; do ldd "$build/$p"; done)
[ -n "$loader" ] || { echo "bundle_for_device.sh: ldd named no glibc loader" >&2; exit 1; }
cp -L "$loader" "$dest/lib/$loader_name"
chmod +x "$dest/lib/$loader_name"

cat > "$dest/run" <<'EOF'
#!/bin/sh
# run PROGRAM [ARGS...]: a bundled Ceres peer program through the bundled glibc loader and libraries.
here=$(cd "$(dirname "$0")" && pwd)
prog=$1; shift
exec "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib" "$here/bin/$prog" "$@"
EOF
chmod +x "$dest/run"

# Check: through the bundled loader every library resolves inside the bundle, and both run.
for p in "${programs[@]}"; do
  listing=$("$dest/lib/$loader_name" --list --library-path "$dest/lib" "$dest/bin/$p")
  outside=$(echo "$listing" | awk '/=>/ && $3 !~ "^'"$dest"'/lib/" {print}')
  if [ -n "$outside" ]; then
    echo "bundle_for_device.sh: $p loads libraries from outside $dest:" >&2; echo "$outside" >&2; exit 1
  fi
  "$dest/run" "$p" --help >/dev/null
done

{
  echo "Ceres peer bundle made $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown OS}")"
  echo "Ceres $(dpkg-query -W -f '${Version}' libceres-dev 2>/dev/null || echo '(not from dpkg)'), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "files (bytes, Debian package where known):"
  (cd "$dest" && for f in bin/* lib/*; do
     src=$(awk -v n="$(basename "$f")" '$1 == n {print $2; exit}' .sources)
     pkg=
     if [ -n "$src" ]; then
       pkg=$(dpkg -S "$src" 2>/dev/null || dpkg -S "$(readlink -f "$src")" 2>/dev/null || true)
       pkg=$(echo "$pkg" | head -1 | cut -d: -f1)
     fi
     printf '  %-32s %9s  %s %s\n' "$f" "$(stat -c %s "$f")" "${src:-built here}" "${pkg:+($pkg)}"
   done)
} > "$dest/MANIFEST.txt"
rm -f "$dest/.sources"

size=$(du -sb --exclude=cuda "$dest" | awk '{print $1}')
if [ "$size" -gt $((limit_mib * 1024 * 1024)) ]; then
  echo "bundle_for_device.sh: $dest is $((size / 1048576)) MiB, over the ${limit_mib} MiB carry budget" >&2; exit 1
fi

exclude=$(git -C "$root" rev-parse --git-path info/exclude 2>/dev/null || true)
if [ -n "$exclude" ]; then
  case "$exclude" in /*) ;; *) exclude=$root/$exclude ;; esac
  mkdir -p "$(dirname "$exclude")"
  grep -qxF '/.peers/' "$exclude" 2>/dev/null || echo '/.peers/' >> "$exclude"
fi
echo "$dest: $(ls "$dest/lib" | wc -l) libraries, $((size / 1048576)) MiB; carry it and set PYCLAD_CERES_PEERS=$(basename "$dest")"
