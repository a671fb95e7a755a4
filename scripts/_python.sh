# Sourced by scripts/test.sh and scripts/demo.sh (after they cd to the checkout): picks the Python that hetauto is
# installed into and run with, so the scripts work on a stock machine whose system Python refuses `pip install`.
#
#   1. an active virtualenv ($VIRTUAL_ENV, or python3 already runs inside one): that one;
#   2. else ./.venv in the checkout, if an earlier run made it;
#   3. else python3 itself, if pip may install into it (a root CI machine, pyenv, conda, ...);
#   4. else (PEP 668: "externally-managed-environment", stock Debian/Ubuntu; or no pip) it creates ./.venv and
#      uses that.
#
# Sets PY (that interpreter), puts its scripts folder first on PATH (so `hetauto` is the one installed there) and
# defines a `python3` function that runs $PY, so a script's existing `python3 -m pip ...` lines use it unchanged.
# HETAUTO_PYTHON names the interpreter to start from instead of python3.

unset -f python3 2>/dev/null || true  # sourced twice: start from the real one
_hetauto_checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_hetauto_base="${HETAUTO_PYTHON:-python3}"

_hetauto_pip_refused() {  # pip's own verdict: a dry run that stops at PEP 668 before looking for any package
    local out
    out="$("$_hetauto_base" -m pip install --dry-run --quiet --no-index --no-deps hetauto-pip-probe 2>&1 || true)"
    [[ "$out" == *externally-managed-environment* || "$out" == *"No module named pip"* ]]
}

if [[ -n "${VIRTUAL_ENV:-}" && -x "${VIRTUAL_ENV}/bin/python" ]]; then
    PY="${VIRTUAL_ENV}/bin/python"
elif "$_hetauto_base" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
    PY="$(command -v "$_hetauto_base")"
elif [[ -x "$_hetauto_checkout/.venv/bin/python" ]]; then
    PY="$_hetauto_checkout/.venv/bin/python"
elif ! _hetauto_pip_refused; then
    PY="$(command -v "$_hetauto_base")"
else
    echo "$(basename "$0"): $_hetauto_base refuses pip install (externally-managed-environment) or has no pip;" \
         "creating $_hetauto_checkout/.venv and installing there" >&2
    if ! "$_hetauto_base" -m venv "$_hetauto_checkout/.venv"; then
        rm -rf "$_hetauto_checkout/.venv"  # half made (no pip): the next run must not take it
        echo "$(basename "$0"): error: cannot create .venv; install the venv module (Debian/Ubuntu:" \
             "apt-get install python3-venv) or activate a virtualenv and rerun" >&2
        exit 1
    fi
    PY="$_hetauto_checkout/.venv/bin/python"
fi
_hetauto_user_path="$PATH"  # the caller's PATH, before the scripts folder goes first (for the hint below)
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PY PATH
python3() { "$PY" "$@"; }
hetauto_activation_hint() {  # the one line a person needs to run `hetauto` in their own shell afterwards
    local bin found
    bin="$(dirname "$PY")"
    found="$(PATH="$_hetauto_user_path" command -v hetauto 2>/dev/null || true)"
    if [[ -f "$bin/activate" && "${VIRTUAL_ENV:-}" != "$(dirname "$bin")" ]]; then
        echo "to run hetauto and python3 -m pytest in your shell, first: source $bin/activate"
    elif [[ -z "$found" ]]; then
        echo "to run hetauto in your shell, first: export PATH=\"$bin:\$PATH\""
    fi
}
unset -f _hetauto_pip_refused
unset _hetauto_checkout _hetauto_base
