# Sourced by the .ci installers. Sets as_root (empty as root, else sudo -n; fails without either) and
# defines apt_install PACKAGE...: an unattended (no stdin) apt-get update and install.
# NAME (set before sourcing) prefixes its messages.
as_root=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "${NAME}: must run as root (or with sudo) to apt-get install" >&2; exit 1; }
    as_root=(sudo -n)
fi

apt_install() {
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" </dev/null
}
