#!/usr/bin/env bash
# FlashAttention-4 for the lent GPU machines (no network there; a call carries at most 64 MiB with the repository):
# its CuTe DSL libraries are a 92 MB wheel, so they travel recompressed (xz) and split over two calls.
#   bash benchmarks/fa4_bundle.sh            # here, once: writes .fa4a (~22 MB) and .fa4b (~52 MB), both git-ignored
#   call 1, carry [".fa4b"]:                 mkdir -p /tmp/stash && cp .fa4b/* /tmp/stash/
#   call 2 (within the machine's idle window), carry [".gpu", ".fa4a"]:
#     source .gpu/setup.sh && source .fa4a/install.sh          # FA4 into /tmp/site beside the bundle's wheels
#   where .gpu + .fa4a + the repository exceed a call's 64 MiB, stash .fa4a too in a call of its own
#   (cp .fa4a/* /tmp/stash/) and source /tmp/stash/install.sh in the call that carries .gpu
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.fa4a/' .git/info/exclude || printf '/.fa4a/\n/.fa4b/\n' >> .git/info/exclude
tmp=$(mktemp -d)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 -d "$tmp" "$@"; }
dl flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
   nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 \
   torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
rm -rf .fa4a .fa4b && mkdir -p .fa4a .fa4b "$tmp/libs"
(cd "$tmp/libs" && python3 -m zipfile -e "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl . && tar cf - . | xz -T0 -7 > "$tmp/libs.tar.xz")
split -b 22000000 -d "$tmp/libs.tar.xz" "$tmp/libs.part"
mv "$tmp/libs.part00" .fa4a/ && mv "$tmp"/libs.part0[1-9] .fa4b/
find "$tmp" -maxdepth 1 -name '*.whl' ! -name 'nvidia_cutlass_dsl_libs_cu13-*' -exec mv {} .fa4b/ \;
cat > .fa4a/install.sh <<'SH'
# sourced on the GPU machine after call 1's stash: the libraries reassembled, the wheels installed into /tmp/site
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ls /tmp/stash/libs.part01 >/dev/null || { echo "no stash from call 1 here (the machine was released)"; return 3; }
mkdir -p /tmp/site
# the wheels first: pip --target --upgrade replaces a top-level folder it finds, and the libraries share theirs
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/stash/*.whl
cat "$here"/libs.part00 /tmp/stash/libs.part0[1-9] | tar xJf - -C /tmp/site   # part00 beside this script
# nvidia_cutlass_dsl_packages.pth puts dsl_packages (the `cutlass` package) on sys.path; PYTHONPATH runs no .pth
export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
SH
rm -rf "$tmp"
du -sh .fa4a .fa4b
