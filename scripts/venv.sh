# shellcheck shell=bash
# Sourced by the other scripts: the Python that qksoftmax is built, installed and tested with lives in a virtual
# environment, never the system's. That is the active one (VIRTUAL_ENV) if any, else QKSOFTMAX_VENV (default
# .venv in the repository), which scripts/deps.sh makes from ${PYTHON:-python3}.
VENV=${VIRTUAL_ENV:-${QKSOFTMAX_VENV:-$PWD/.venv}}
PY=$VENV/bin/python
