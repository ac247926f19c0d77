# Sourced by the scripts that need Debian packages. `apt_install PKG...`
# installs them (as root; otherwise it says what is missing and exits)
# without letting their maintainer scripts start any service: a
# policy-rc.d that denies every start is in place for the install only, and
# only when the machine has none of its own. So nothing has to be stopped
# afterwards, and nothing the user runs (their own nginx, Prometheus or
# PostgreSQL) is ever touched. POLICY_RC_D names the file (tests point it
# elsewhere).
APT_UPDATED=
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "$0: missing $*; install it (or run as root)" >&2
    exit 1
  fi
  echo "$0: installing $*" >&2
  [ -n "$APT_UPDATED" ] || { apt-get update -qq >/dev/null; APT_UPDATED=1; }
  local policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d} ours= status=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# tidings: no service starts while packages install\nexit 101\n' >"$policy"
    chmod +x "$policy"
    ours=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null || status=$?
  if [ -n "$ours" ]; then rm -f "$policy"; fi
  return "$status"
}
