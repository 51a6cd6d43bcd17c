# Sourced by the CI scripts: `apt_install WHO PACKAGE...` installs Debian packages with
# apt-get (through sudo when not root), without recommended extras, or stops with what to
# do instead. WHO names the caller in its messages.
apt_install() {
  local who=$1
  shift
  local fail_message="the packages $* are needed"
  command -v apt-get >/dev/null 2>&1 || { printf '\n%s: FAILED: %s, and there is no apt-get to install them: install them and run this again\n' "$who" "$fail_message" >&2; exit 1; }
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { printf '\n%s: FAILED: installing %s needs root: run this as root, install sudo, or install them first\n' "$who" "$*" >&2; exit 1; }
    sudo=(sudo)
  fi
  ${sudo[@]+"${sudo[@]}"} apt-get update || { printf '\n%s: FAILED: apt-get update failed (see above)\n' "$who" >&2; exit 1; }
  ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
    || { printf '\n%s: FAILED: apt-get could not install %s (see above)\n' "$who" "$*" >&2; exit 1; }
}
