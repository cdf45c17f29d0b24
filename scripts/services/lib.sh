# lib.sh - sourced by the service scripts here (not run on its own).
# private_dir DIR [MODE]: make DIR (mode MODE, default 700) owned by the caller, or refuse in one
# line (exit 1) a DIR that is a symbolic link, not a directory, owned by another user, or that
# group or others can write: the services run as root from fixed paths under /var/tmp (1777),
# where any user could have prepared the directory (its keys, pid files, configs) beforehand.
private_dir() {
  local d=$1 mode=${2:-700} me
  me=$(id -u)
  if [ -L "$d" ] || { [ -e "$d" ] && { [ ! -d "$d" ] || [ "$(stat -c %u "$d")" != "$me" ] \
       || [ $(( 0$(stat -c %a "$d") & 022 )) != 0 ]; }; }; then
    echo "$(basename "$0"): $d is not a directory of uid $me that only it can write (a link, another owner or group/world-writable): remove it" >&2
    exit 1
  fi
  mkdir -p "$d"; chmod "$mode" "$d"
}
