# Sourced by the benchmark scripts: sets `root` and `bin`, the autopar-tune to measure.
# With AUTOPAR_BIN set, that binary is used as it is; otherwise the project is installed and
# built first (scripts/setup.sh, scripts/build.sh) and build/autopar-tune (or
# $AUTOPAR_BUILD_DIR/autopar-tune) is used.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${AUTOPAR_BIN:-} ]]; then
  "$root/scripts/setup.sh"
  "$root/scripts/build.sh" >/dev/null
fi
bin=${AUTOPAR_BIN:-${AUTOPAR_BUILD_DIR:-$root/build}/autopar-tune}
