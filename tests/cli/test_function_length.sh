# No function over ~100 lines in lib/, tools/ and python/ (scripts/check-function-length.py).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3" >&2; exit 77; }
python3 "$root/scripts/check-function-length.py" --root "$root"
