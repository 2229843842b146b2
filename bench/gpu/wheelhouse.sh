#!/usr/bin/env bash
# The packages a bare CUDA machine (torch, transformers, peft, accelerate, opencv, scikit-image already
# there) lacks for the grpo_trl part of bench/gpu/acceptance.py (every other part runs without them),
# as wheels for its Python, in bench/gpu/wheelhouse/ (kept out of git; copied along with the
# checkout). Run it where pip can reach the package index:
#
#   bench/gpu/wheelhouse.sh [PYTHON_VERSION]        # default 3.12, the GPU image's
#
# and on the GPU machine, before the acceptance:
#
#   pip install --no-index --no-deps --target /tmp/site bench/gpu/wheelhouse/*.whl && export PYTHONPATH=/tmp/site:.
#   apt-get install libseccomp2 (or carry its .so) if the sandbox's seccomp layer reports it missing
set -euo pipefail
cd "$(dirname "$0")"
PY=${1:-3.12}
PIP=${PIP:-python3 -m pip}
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf wheelhouse
mkdir -p wheelhouse
# Pure-python packages at the versions this checkout was tested with (the ones installed here).
for package in trl datasets dill multiprocess; do
    $PIP download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
        --platform manylinux2014_x86_64 --platform any -d wheelhouse "$package==$(version "$package")"
done
size=$(du -sm wheelhouse | cut -f1)
echo "wheelhouse: $(find wheelhouse -name '*.whl' | wc -l) wheels, ${size} MiB in $(pwd)/wheelhouse"
if [[ $size -ge 60 ]]; then
    echo "wheelhouse: over 60 MiB, too large to travel with the checkout" >&2
    exit 1
fi
