# pip_quiet ARGS...: pip of $PY (else python3), quiet, without the "Location ... is ignored" lines some
# machines' pip config causes; returns pip's exit status. Sourced by launch/setup.sh and launch/gpu_check.sh.
pip_quiet() {
    local status
    "${PY:-python3}" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v '^WARNING: Location' || true; } >&2
    status=${PIPESTATUS[0]}
    return "$status"
}
