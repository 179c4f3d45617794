#!/usr/bin/env bash
# Installs the Debian packages named in the arguments when some are missing:
# with apt-get as root, with sudo otherwise, else prints what to install.
set -u
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "megatron_c: installing missing packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
  echo "megatron_c: please install: apt-get install ${missing[*]}" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null || {
  echo "megatron_c: could not install ${missing[*]}; please install them with apt-get" >&2; exit 1; }
