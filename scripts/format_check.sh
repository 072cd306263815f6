#!/usr/bin/env bash
# The format stage of CI (docs/testing.md §4): every C++ line changed since the baseline commit
# below must be as clang-format (14, with the checked-in .clang-format) would write it.
#
# The tree as a whole is not formatted yet (at the baseline 48 files differ), and reformatting it
# in one commit would collide with work in flight, so only lines changed since the baseline are
# checked: committed changes, and on a developer's machine the uncommitted ones of tracked files.
# Fix a failure with the diff printed below, or `git diff -U0 BASE | clang-format-diff-14 -p1 -i`.
# Once the whole tree is formatted in one commit, move the baseline to that commit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
baseline=2c8fd3df0e95d003eab5032ce84a8d3f9d6e8e53
format_diff=${CLANG_FORMAT_DIFF:-clang-format-diff-14}
clang_format=${CLANG_FORMAT:-clang-format-14}

if ! git cat-file -e "$baseline^{commit}" 2>/dev/null; then
  echo "format_check.sh: the baseline commit $baseline is not in this clone (a shallow clone?);"
  echo "fetch the history (git fetch --unshallow) and run again"
  exit 1
fi
out=$(git diff -U0 --no-color "$baseline" -- '*.cc' '*.h' '*.cu' '*.cuh' |
      "$format_diff" -p1 -regex '.*\.(cc|h|cu|cuh)' -binary "$clang_format")
if [[ -n $out ]]; then
  printf '%s\n' "$out"
  echo "format_check.sh: the lines above, changed since ${baseline:0:7}, are not clang-formatted"
  exit 1
fi
echo "format_check.sh: every C++ line changed since ${baseline:0:7} is clang-formatted"
