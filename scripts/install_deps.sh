#!/usr/bin/env bash
# Installs the Debian packages Loom builds against. Idempotent: does nothing when all
# are present. Runs as root (CI and the dev machines) or through sudo.
set -euo pipefail
# --fuzz adds clang and its libFuzzer runtime (for `make fuzz`); --test adds Chromium (the
# headless browser `make test` opens `loom report`'s page in).
pkgs=(cmake g++ make pkg-config libopenblas-openmp-dev libdnnl-dev nlohmann-json3-dev libgtest-dev
      openmpi-bin libopenmpi-dev protobuf-compiler libprotobuf-dev libboost-dev)
for flag in "$@"; do
  case $flag in
    --fuzz) pkgs+=(clang libclang-rt-14-dev) ;;
    --test) pkgs+=(chromium) ;;
    *) echo "install_deps: unknown option $flag" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
