# Shared by the scripts: install what is missing, find the toolchain.
# Sourced, not executed.

# ensure_packages PKG...: apt-get install the Debian packages not yet installed.
ensure_packages() {
    local missing=()
    for package in "$@"; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing: ${missing[*]}"
        if [ "$(id -u)" -ne 0 ]; then
            echo "error: packages ${missing[*]} are missing and installing them needs root" >&2
            exit 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null \
            || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
    fi
}

# require_cargo: a Rust toolchain new enough for edition 2024.
require_cargo() {
    if ! command -v cargo >/dev/null 2>&1; then
        for candidate in "$HOME/.cargo/bin" /root/.cargo/bin; do
            [ -x "$candidate/cargo" ] && export PATH="$candidate:$PATH" && break
        done
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: cargo not found; install Rust 1.85 or newer (https://rustup.rs)" >&2
        exit 1
    fi
}
