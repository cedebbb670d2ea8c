#!/usr/bin/env bash
# Installs gnuplot-nox (Debian) when gnuplot is missing; does nothing otherwise. Used by the plot
# scripts.
set -euo pipefail
command -v gnuplot >/dev/null 2>&1 && exit 0
sudo_cmd=""
[[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
$sudo_cmd apt-get install -y gnuplot-nox >/dev/null ||
  { $sudo_cmd apt-get update >/dev/null && $sudo_cmd apt-get install -y gnuplot-nox >/dev/null; }
