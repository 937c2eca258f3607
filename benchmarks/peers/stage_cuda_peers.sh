#!/usr/bin/env bash
# Stage the official CUDA operators that bench_dcnv4.py and bench_deformable_aggregation.py time
# as peers: DCNv4's dcnv4 op (OpenGVLab/DCNv4) and Sparse4D's deformable aggregation
# (HorizonRobotics/Sparse4D). The files are extracted from bare git mirrors into the
# git-ignored folder .peers/cuda/ and read from there at run time by benchmarks/cuda_peers.py;
# nothing of them is copied into tracked files.
#
#   benchmarks/peers/stage_cuda_peers.sh [DEST]          # DEST defaults to .peers/cuda
#
# Mirrors: $DCNV4_GIT and $SPARSE4D_GIT (bare git dirs), by default the ones the session's
# fetch tool leaves under /work/.mirror. $DCNV4_REV / $SPARSE4D_REV pick a commit (HEAD).
# Then carry the folder to the GPU machine (device tool: carry [".device", ".peers/cuda"]).
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dest=${1:-$root/.peers/cuda}
dcnv4_git=${DCNV4_GIT:-/work/.mirror/OpenGVLab+DCNv4/repo}
sparse4d_git=${SPARSE4D_GIT:-/work/.mirror/HorizonRobotics+Sparse4D/repo}
dcnv4_rev=${DCNV4_REV:-HEAD}
sparse4d_rev=${SPARSE4D_REV:-HEAD}

die() { echo "stage_cuda_peers: $*" >&2; exit 1; }

for g in "$dcnv4_git" "$sparse4d_git"; do
  git --git-dir="$g" rev-parse --verify -q HEAD >/dev/null ||
    die "no git mirror at $g (fetch github:OpenGVLab/DCNv4 and github:HorizonRobotics/Sparse4D, or set DCNV4_GIT / SPARSE4D_GIT)"
done

# The destination must stay out of the project's history.
if [[ $dest == "$root"/* ]]; then
  mkdir -p "$dest"
  git -C "$root" check-ignore -q "$dest/probe" ||
    die "$dest is not git-ignored: add /.peers/ to .git/info/exclude first"
fi

# extract GIT REV SRC DST: one file from a mirror
extract() {
  local g=$1 rev=$2 src=$3 dst=$4
  mkdir -p "$(dirname "$dst")"
  git --git-dir="$g" show "$rev:$src" >"$dst" || die "$src not found in $g at $rev"
}

# builds from another machine are of no use there (and would travel with the carry)
rm -rf "$dest/DCNv4" "$dest/Sparse4D" "$dest/build"

# DCNv4: only the dcnv4 op (not flash_deform_attn): the .cu, the headers it includes, the
# header that declares its entry points (our binding includes it), and the Python function
# whose launch heuristic (findspec / find_spec_bwd and their TABLE) picks d_stride and
# block_thread per shape.
d=DCNv4_op
for f in src/cuda/dcnv4_cuda.cu src/cuda/dcnv4_cuda.h src/cuda/dcnv4_im2col_cuda.cuh \
         src/cuda/dcnv4_col2im_cuda.cuh src/cuda/common.h \
         DCNv4/functions/dcnv4_func.py DCNv4/functions/table.py setup.py; do
  extract "$dcnv4_git" "$dcnv4_rev" "$d/$f" "$dest/DCNv4/$f"
done
extract "$dcnv4_git" "$dcnv4_rev" LICENSE "$dest/DCNv4/LICENSE"

# Sparse4D: its deformable aggregation extension as published (binding .cpp + kernels .cu)
# and the autograd Function that calls it (how the backward's gradient buffers are made).
s=projects/mmdet3d_plugin/ops
srcs=$(git --git-dir="$sparse4d_git" ls-tree --name-only "$sparse4d_rev" "$s/src/") ||
  die "$s/src not found in $sparse4d_git"
for f in $srcs; do
  case $f in *.cpp|*.cu|*.cuh|*.h) extract "$sparse4d_git" "$sparse4d_rev" "$f" "$dest/Sparse4D/ops/src/${f##*/}";; esac
done
for f in deformable_aggregation.py setup.py; do
  extract "$sparse4d_git" "$sparse4d_rev" "$s/$f" "$dest/Sparse4D/ops/$f"
done
extract "$sparse4d_git" "$sparse4d_rev" LICENSE "$dest/Sparse4D/LICENSE" 2>/dev/null ||
  echo "stage_cuda_peers: note: Sparse4D has no top-level LICENSE at $sparse4d_rev" >&2

# Every quoted #include must resolve inside the staged tree (beside the file, or from src/).
missing=0
while IFS= read -r file; do
  dir=$(dirname "$file")
  while IFS= read -r inc; do
    [[ -e $dir/$inc || -e $dest/DCNv4/src/$inc || -e $dest/Sparse4D/ops/src/$inc ]] ||
      { echo "stage_cuda_peers: $file includes \"$inc\", which is not staged" >&2; missing=1; }
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find "$dest/DCNv4" "$dest/Sparse4D" -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp')
[[ $missing == 0 ]] || die "incomplete staging"

{
  echo "# staged by benchmarks/peers/stage_cuda_peers.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "DCNv4    github.com/OpenGVLab/DCNv4 $(git --git-dir="$dcnv4_git" rev-parse "$dcnv4_rev")"
  echo "Sparse4D github.com/HorizonRobotics/Sparse4D $(git --git-dir="$sparse4d_git" rev-parse "$sparse4d_rev")"
  (cd "$dest" && find DCNv4 Sparse4D -type f | sort | xargs sha256sum)
} >"$dest/SOURCES.txt"
echo "staged into $dest:"
cat "$dest/SOURCES.txt"
