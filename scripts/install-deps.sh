#!/usr/bin/env bash
# Installs everything aspen needs to build, test and benchmark, from Debian's
# packages. Used by the README's setup command and by .ci/run.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache
  libdnnl-dev        # oneDNN: matrix products
  libopenblas-dev    # OpenBLAS: a benchmark peer only
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev nlohmann-json3-dev libcli11-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
