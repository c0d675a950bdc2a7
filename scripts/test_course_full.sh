#!/usr/bin/env bash
# Every chapter of the course in full mode (MINENGINE_FAST unset), chapters 04 and 10 included, which the README's
# test command leaves out (tests/course/test_full_mode.py). About half an hour on the 2-core CI machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1 MINENGINE_COURSE_FULL_ALL=1
python3 -m pytest -q -n 2 --dist loadscope tests/course/test_full_mode.py "$@"
