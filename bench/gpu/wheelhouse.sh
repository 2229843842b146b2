#!/usr/bin/env bash
# The packages a bare CUDA machine (torch, transformers, peft, accelerate there) lacks for
# bench/gpu/acceptance.py, as wheels for its Python, in bench/gpu/wheelhouse/ (kept out of git; copied
# along with the checkout): trl and datasets for the grpo_trl part; inflect and its requirements, which
# vprl itself imports (the oracle's plurals), so that the preflight's imports succeed; and
# opencv-python-headless, which the shapes tools import (the world's segmentation). Each is skipped
# where IMAGE_PACKAGES shows the image has it. No part imports scikit-image. Run it where pip can
# reach the package index:
#
#   bench/gpu/wheelhouse.sh [PYTHON_VERSION]        # default 3.12, the GPU image's
#   IMAGE_PACKAGES=image-freeze.txt bench/gpu/wheelhouse.sh   # `pip list --format=freeze` of the image:
#                                                             # what it lists is not fetched
#
# and on the GPU machine, before the acceptance:
#
#   pip install --no-index --no-deps --target /tmp/site bench/gpu/wheelhouse/*.whl && export PYTHONPATH=/tmp/site:.
#   apt-get install libseccomp2 (or carry its .so) if the sandbox's seccomp layer reports it missing
set -euo pipefail
cd "$(dirname "$0")"
PY=${1:-3.12}
PIP=${PIP:-python3 -m pip}
OUT=${WHEELHOUSE:-$(pwd)/wheelhouse}  # where the wheels go (a test points it elsewhere)
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf "$OUT"
mkdir -p "$OUT"
# A package at the version this checkout was tested with (the one installed here), for the image's
# platform (`$2`: the binary one, or `any` for pure Python), unless IMAGE_PACKAGES lists it.
fetch() {
    if [[ -n ${IMAGE_PACKAGES:-} ]] && grep -qi -E "^$1==" "$IMAGE_PACKAGES"; then
        echo "wheelhouse: $1 is on the image ($IMAGE_PACKAGES), not fetched"
        return
    fi
    $PIP download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
        --platform manylinux2014_x86_64 --platform "$2" -d "$OUT" "$1==$(version "$1")"
}
for package in trl datasets dill multiprocess inflect jaraco.functools more-itertools typeguard; do
    fetch "$package" any
done
fetch opencv-python-headless manylinux_2_28_x86_64
size=$(du -sm "$OUT" | cut -f1)
echo "wheelhouse: $(find "$OUT" -name '*.whl' | wc -l) wheels, ${size} MiB in $OUT"
if [[ $size -ge 60 ]]; then
    echo "wheelhouse: over 60 MiB, too large to travel with the checkout" >&2
    exit 1
fi
