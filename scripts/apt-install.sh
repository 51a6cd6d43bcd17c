# Sourced by scripts/provision.sh: `apt_install WHO PACKAGE...` installs Debian packages
# with apt-get (through sudo without a password prompt when not root), without recommended
# extras and without starting their services, or stops with what to do instead. WHO names
# the caller in its messages.
apt_install() {
  local who=$1
  shift
  local fail_message="the packages $* are needed"
  command -v apt-get >/dev/null 2>&1 || { printf '\n%s: FAILED: %s, and there is no apt-get to install them: install them and run this again\n' "$who" "$fail_message" >&2; exit 1; }
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    # -n: never stop a test run to ask for a password; without one, say what to run instead.
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null \
      || { printf '\n%s: FAILED: installing %s needs root (and sudo would ask for a password): run this as root, or install them first\n' "$who" "$*" >&2; exit 1; }
    sudo=(sudo -n)
  fi
  # Only the packages' programs are wanted, not their services: on a machine with an init,
  # Debian would start and enable haproxy, prometheus and alertmanager. A policy-rc.d that
  # answers 101 ("action forbidden") keeps them stopped, for the length of this install.
  local policy=/usr/sbin/policy-rc.d
  local own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# Written by llmgw scripts/apt-install.sh for one install; removed after it.\nexit 101\n' | ${sudo[@]+"${sudo[@]}"} tee "$policy" >/dev/null \
      && ${sudo[@]+"${sudo[@]}"} chmod 755 "$policy" && own_policy=1
  fi
  local status=0
  ${sudo[@]+"${sudo[@]}"} apt-get update || status=1
  if [ "$status" = 0 ]; then
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" || status=2
  fi
  [ "$own_policy" = 1 ] && ${sudo[@]+"${sudo[@]}"} rm -f "$policy"
  [ "$status" = 1 ] && { printf '\n%s: FAILED: apt-get update failed (see above)\n' "$who" >&2; exit 1; }
  [ "$status" = 2 ] && { printf '\n%s: FAILED: apt-get could not install %s (see above)\n' "$who" "$*" >&2; exit 1; }
  return 0
}
