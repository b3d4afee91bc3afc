# Shared by the README's two commands: install what is missing, then build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# From Debian: the compiler and build tools (ccache lets the wheel's build
# take the build tree's objects), the C++ test and benchmark libraries, JSON,
# a Python to make the virtual environment with, and the browser the HTML
# report test renders in. Everything torch comes from PyPI.
PACKAGES=(cmake make ninja-build g++ ccache python3 python3-dev python3-venv nlohmann-json3-dev libgtest-dev
          libbenchmark-dev chromium)
VENV=.venv
REQUIREMENTS=scripts/requirements.txt

install_missing() {
  local missing=()
  for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$package")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  # The project's virtual environment, made by Debian's Python and filled
  # from PyPI; reinstalled only when the pins change.
  [[ -x $VENV/bin/python ]] || /usr/bin/python3 -m venv "$VENV"
  if ! cmp -s "$REQUIREMENTS" "$VENV/requirements.installed"; then
    echo "installing into $VENV: $(grep -v '^#' "$REQUIREMENTS" | tr '\n' ' ')"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
    cp "$REQUIREMENTS" "$VENV/requirements.installed"
  fi
}

build() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
  cmake --build build -j "$(nproc)"
}
