#!/usr/bin/env bash
# run-in-vm.sh: run one command as root in a throw-away QEMU guest whose
# kernel has a pure cgroup v2 hierarchy, and exit with the command's status.
#
#   test/integration/vm/run-in-vm.sh [--allow-tcg|--tcg] [--timeout SEC]
#       [--mem SIZE] [--cpus N] [-v] -- COMMAND [ARGS...]
#   test/integration/vm/run-in-vm.sh --kvm-usable   # exit 0, or 1 and why
#
# Why: str's cgroup v2 path (CLONE_INTO_CGROUP, memory.max, pids.max,
# cpu.max, cgroup.kill, delegation) cannot run on hosts whose controllers are
# all bound to cgroup v1. The guest boots with cgroup_no_v1=all, mounts
# cgroup2 at /sys/fs/cgroup and enables every controller at the root.
#
# The guest, in one table:
#   kernel   Debian's linux-image-amd64, fetched with apt-get download into
#            the cache (never installed); booted as its uncompressed vmlinux
#   initrd   busybox-static plus the virtio/9p/overlay modules
#   /        the host's / over virtio-9p, read-only, under a tmpfs overlay:
#            every host binary works, writes vanish with the VM
#   command  runs as root in the host's cwd with the host's exported
#            environment plus STR_CGROUP_V2=1, in the root cgroup (0::/);
#            stdin is /dev/null; stdout/stderr come back over virtio-serial
#   network  lo up, and dummy0 with 10.0.2.15/24: an address that is not
#            loopback, as a host has one
#   exit     the command's status; 124 timeout; 125 harness or guest failure
#
# Accelerator: KVM when it really works (/dev/kvm read-write and a CPU with
# vmx or svm); otherwise TCG emulation, which needs --allow-tcg (or
# STR_VM_ALLOW_TCG=1) because it is slow: ~4 s to boot, process start-up
# ~50x slower than on the host. --tcg forces TCG.
#
# As root it installs what it needs (qemu-system-x86, busybox-static,
# xz-utils) with apt-get. Cache: $STR_VM_CACHE, else ~/.cache/str-vm
# (about 60 MB; delete it to pick up a newer Debian kernel).
# shellcheck disable=SC2054 # commas in arrays are qemu option syntax
set -euo pipefail

prog=run-in-vm
die() { echo "$prog: $*" >&2; exit 125; }
say() { echo "$prog: $*" >&2; }

# kvm_unusable prints why KVM cannot run the guest and succeeds, or fails
# silently when it can.
kvm_unusable() {
  if [[ ! -c /dev/kvm ]]; then echo "no /dev/kvm"
  elif [[ ! -r /dev/kvm || ! -w /dev/kvm ]]; then echo "/dev/kvm is not read-write for $(id -un)"
  elif ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
    if [[ -d /sys/module/kvm_pvm ]]; then echo "the CPU has no vmx/svm (/dev/kvm is PVM, which boots only PVM guest kernels)"
    else echo "the CPU has no vmx/svm"; fi
  else return 1
  fi
}

# ---- 0. options -------------------------------------------------------------
accel=auto allow_tcg=${STR_VM_ALLOW_TCG:-0} timeout=600 mem=2G cpus=$(nproc) verbose=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --allow-tcg) allow_tcg=1 ;;
    --tcg) accel=tcg ;;
    --timeout) timeout=${2:?}; shift ;;
    --mem) mem=${2:?}; shift ;;
    --cpus) cpus=${2:?}; shift ;;
    -v) verbose=1 ;;
    --kvm-usable) if why=$(kvm_unusable); then echo "$why"; exit 1; fi; exit 0 ;;
    --) shift; break ;;
    *) sed -n '5,7s/^# \{0,1\}//p' "$0" >&2; exit 125 ;;
  esac
  shift
done
[[ $# -gt 0 ]] || die "no command (usage: run-in-vm.sh [options] -- COMMAND [ARGS...])"
[[ $timeout =~ ^[0-9]+$ ]] || die "--timeout: seconds, got $timeout"

cache=${STR_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/str-vm}
mkdir -p "$cache"
exec 8>"$cache/lock"
flock 8 # one run at a time fills the cache; released before boot

# ---- 1. host packages -------------------------------------------------------
apt_updated=0
apt_update() {
  [[ $apt_updated == 1 ]] && return
  apt-get update -q >>"$cache/apt.log" 2>&1 || die "apt-get update failed (see $cache/apt.log)"
  apt_updated=1
}
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
[[ -x /bin/busybox ]] && /bin/busybox --list 2>/dev/null | grep -qx insmod || missing+=(busybox-static)
command -v xz >/dev/null || missing+=(xz-utils)
if [[ ${#missing[@]} -gt 0 ]]; then
  [[ $(id -u) == 0 ]] || die "missing packages: ${missing[*]} (sudo apt-get install ${missing[*]})"
  say "installing ${missing[*]}"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$cache/apt.log" 2>&1; then
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$cache/apt.log" 2>&1 ||
      die "apt-get install ${missing[*]} failed (see $cache/apt.log)"
  fi
fi
bb=/bin/busybox
# busybox-static's binary must really be static: it runs alone in the initrd.
magic=$(LC_ALL=C od -An -c -N4 "$bb" | tr -d ' ')
[[ $magic == 177ELF ]] || die "$bb is not an ELF binary"

# ---- 2. guest kernel ----------------------------------------------------------
# The newest cached kernel, else the version linux-image-amd64 depends on.
kver=${STR_VM_KVER:-}
if [[ -z $kver ]]; then
  kver=$(cd "$cache" && for d in kernel-*/vmlinux; do if [[ -f $d ]]; then echo "${d%/vmlinux}"; fi; done | sed 's/^kernel-//' | sort -V | tail -1)
fi
resolve_kver() { apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -1; }
if [[ -z $kver ]]; then
  kver=$(resolve_kver)
  if [[ -z $kver && $(id -u) == 0 ]]; then apt_update; kver=$(resolve_kver); fi
  [[ -n $kver ]] || die "cannot resolve linux-image-amd64 to a kernel version (run apt-get update)"
fi
kdir=$cache/kernel-$kver
# The modules the initrd loads; a cache filled with another list is redone.
modules="virtio_pci virtio_console 9pnet_virtio 9p overlay dummy"
if [[ ! -f $kdir/vmlinux || $(cat "$kdir/modules" 2>/dev/null) != "$modules" ]]; then
  say "fetching linux-image-$kver (first run only)"
  tmp=$(mktemp -d "$cache/fetch.XXXXXX")
  if ! (cd "$tmp" && apt-get download -q "linux-image-$kver" >>"$cache/apt.log" 2>&1); then
    [[ $(id -u) == 0 ]] && apt_update
    (cd "$tmp" && apt-get download -q "linux-image-$kver" >>"$cache/apt.log" 2>&1) ||
      { rm -rf "$tmp"; die "apt-get download linux-image-$kver failed (see $cache/apt.log)"; }
  fi
  dpkg-deb -x "$tmp"/linux-image-*.deb "$tmp/x"
  mdir=$tmp/x/lib/modules/$kver
  "$bb" depmod -b "$tmp/x" "$kver" || die "depmod $kver failed"
  # Only the modules the initrd loads, in dependency order (deps first).
  mkdir -p "$tmp/k/mod"
  declare -A seen=()
  load_order=()
  add_module() { # $1: path relative to the modules dir
    local m=$1 d
    [[ -z ${seen[$m]:-} ]] || return 0
    seen[$m]=1
    # shellcheck disable=SC2013 # modules.dep lists words
    for d in $(awk -F': *' -v m="$m" '$1 == m { print $2 }' "$mdir/modules.dep"); do add_module "$d"; done
    load_order+=("$m")
  }
  for name in $modules; do
    path=$(awk -F: -v n="/$name.ko" 'substr($1, length($1) - length(n) + 1) == n { print $1 }' "$mdir/modules.dep")
    if [[ -n $path ]]; then add_module "$path"
    elif ! grep -q "/$name.ko\$" "$mdir/modules.builtin"; then die "module $name: neither in modules.dep nor built in"; fi
  done
  i=10
  for m in "${load_order[@]}"; do cp "$mdir/$m" "$tmp/k/mod/$i-${m##*/}"; i=$((i + 1)); done
  # The bzImage's payload is an xz stream; the uncompressed ELF boots
  # through its PVH entry and skips the in-guest decompression, which
  # costs seconds under TCG.
  vmlinuz=$tmp/x/boot/vmlinuz-$kver
  off=$(LC_ALL=C grep -obUaP '\xFD7zXZ\x00' "$vmlinuz" | head -1 | cut -d: -f1)
  [[ -n $off ]] || die "no xz payload in $vmlinuz"
  tail -c +$((off + 1)) "$vmlinuz" | xz -dcq >"$tmp/k/vmlinux" 2>/dev/null || true # trailing data after the stream
  [[ $(LC_ALL=C od -An -c -N4 "$tmp/k/vmlinux" | tr -d ' ') == 177ELF ]] || die "could not extract vmlinux from $vmlinuz"
  echo "$modules" >"$tmp/k/modules"
  rm -rf "$kdir" && mv "$tmp/k" "$kdir" && rm -rf "$tmp"
fi

# ---- 3. initrd --------------------------------------------------------------
# Stage 1 (busybox, PID 1): load the modules, build the root (host / over 9p
# + tmpfs overlay), mount proc/sys/dev/cgroup2 into it, switch_root. Stage 2
# (the host's /bin/sh, still PID 1) runs the command and powers off.
read -r -d '' init_script <<'EOF' || true
#!/bin/sh
fail() { echo "str-vm: $*"; echo o >/proc/sysrq-trigger; sleep 30; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo 1 >/proc/sys/kernel/printk    # keep OOM reports and the like off the console
for m in /mod/*.ko; do insmod "$m" || fail "insmod $m"; done
p9=trans=virtio,version=9p2000.L,msize=512000
mkdir -p /lower /upper /root
mount -t 9p -o "$p9,ro,cache=loose" host /lower || fail "mount host / over 9p"
mount -t tmpfs -o mode=0755 upper /upper && mkdir /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work root /root || fail "mount overlay root"
r=/root
mount -t tmpfs -o mode=0755,nosuid,nodev run $r/run
mkdir -p $r/run/str-vm
mount -t 9p -o "$p9,cache=mmap" scratch $r/run/str-vm || fail "mount scratch dir"
mount --move /proc $r/proc
mount --move /sys $r/sys
mount --move /dev $r/dev
mkdir -p $r/dev/pts $r/dev/shm $r/dev/virtio-ports
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts $r/dev/pts
ln -sf pts/ptmx $r/dev/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev shm $r/dev/shm
ln -sf /proc/self/fd $r/dev/fd
for p in $r/sys/class/virtio-ports/vport*; do ln -sf "../${p##*/}" "$r/dev/virtio-ports/$(cat "$p/name")"; done
# Pure cgroup v2: cgroup_no_v1=all on the command line, cgroup2 here, and
# every controller the kernel has enabled for the root's children.
mount -t cgroup2 -o nsdelegate cgroup2 $r/sys/fs/cgroup || fail "mount cgroup2"
for c in $(cat $r/sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" >$r/sys/fs/cgroup/cgroup.subtree_control || fail "enable controller $c"
done
grep -q ' cgroup ' $r/proc/mounts && fail "a cgroup v1 hierarchy is mounted"
ip link set lo up
# A non-loopback address of the guest's own (dummy0, from dummy.ko's
# numdummies=1): what the hostile battery's "host's other address" cases
# listen on and expect the sandbox not to reach.
ip link set dummy0 up && ip addr add 10.0.2.15/24 dev dummy0 || fail "dummy0 with 10.0.2.15"
hostname str-vm
export STR_CGROUP_V2=1
exec switch_root $r /bin/sh -c '
  /bin/bash /run/str-vm/cmd.sh </dev/null >/dev/virtio-ports/stdout 2>/dev/virtio-ports/stderr
  echo $? >/run/str-vm/rc
  echo o >/proc/sysrq-trigger; sleep 30'
EOF
initrd=$cache/initrd-$kver-$(printf '%s' "$init_script" | sha256sum | cut -c1-12).cpio
if [[ ! -f $initrd ]]; then
  ir=$(mktemp -d "$cache/initrd.XXXXXX")
  mkdir -p "$ir"/{bin,dev,proc,sys,run,mod}
  cp "$bb" "$ir/bin/busybox"
  for a in sh mount insmod mkdir ln cat grep ip hostname switch_root sleep echo; do ln -s busybox "$ir/bin/$a"; done
  cp "$kdir"/mod/*.ko "$ir/mod/"
  printf '%s\n' "$init_script" >"$ir/init" && chmod 755 "$ir/init"
  (cd "$ir" && find . | "$bb" cpio -o -H newc 2>/dev/null) >"$initrd.tmp"
  rm -f "$cache"/initrd-*.cpio && mv "$initrd.tmp" "$initrd" && rm -rf "$ir"
fi
exec 8>&- # cache ready

# ---- 4. accelerator ---------------------------------------------------------
if [[ $accel == auto ]]; then
  why=$(kvm_unusable) || true
  if [[ -z $why ]]; then accel=kvm
  elif [[ $allow_tcg == 1 ]]; then say "KVM not usable ($why): TCG emulation, slow"; accel=tcg
  else die "KVM not usable: $why. Pass --allow-tcg (or STR_VM_ALLOW_TCG=1) to emulate with TCG (~50x slower process start)"
  fi
fi
if [[ $accel == kvm ]]; then accel_args=(-accel kvm -cpu host)
else accel_args=(-accel tcg,thread=multi -cpu max); fi

# ---- 5. this run's scratch dir ----------------------------------------------
s=$(mktemp -d "${TMPDIR:-/tmp}/str-vm.XXXXXX")
pids=() # background jobs: qemu's timeout(1), the output copiers
# shellcheck disable=SC2317 # reached through the traps
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$s"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
{
  # The caller's environment (STR_CGROUP_V2 comes from the guest, never
  # from here), umask, fd limit and cwd; then the command.
  export -p | grep -vE '^declare -x (BASHOPTS|SHELLOPTS|SHLVL|OLDPWD|_|STR_CGROUP_V2)='
  printf 'umask %s\nulimit -n %s 2>/dev/null\n' "$(umask)" "$(ulimit -n)"
  printf 'cd -- %q || exit 125\nexec' "$PWD"
  printf ' %q' "$@"
  printf '\n'
} >"$s/cmd.sh"
mkfifo "$s/stdout" "$s/stderr"
cat "$s/stdout" &
pids+=($!)
cat "$s/stderr" >&2 &
pids+=($!)

# ---- 6. boot ----------------------------------------------------------------
fsdev=security_model=none,multidevs=remap
append="console=ttyS0 quiet loglevel=1 panic=-1 cgroup_no_v1=all mitigations=off"
append+=" tsc=reliable no_timer_check cryptomgr.notests 8250.nr_uarts=1 rdinit=/init"
qemu=(qemu-system-x86_64 "${accel_args[@]}" -M q35 -bios /usr/share/qemu/qboot.rom
  -nodefaults -no-user-config -display none -no-reboot -m "$mem" -smp "$cpus"
  -kernel "$kdir/vmlinux" -initrd "$initrd" -append "$append"
  -serial "file:$s/console.log"
  -virtfs "local,path=/,mount_tag=host,readonly=on,$fsdev"
  -virtfs "local,path=$s,mount_tag=scratch,$fsdev"
  -device virtio-serial-pci,id=vser
  -chardev "file,id=out,path=$s/stdout" -device virtserialport,bus=vser.0,chardev=out,name=stdout
  -chardev "file,id=err,path=$s/stderr" -device virtserialport,bus=vser.0,chardev=err,name=stderr)
[[ $verbose == 1 ]] && say "accel=$accel kernel=$kver mem=$mem cpus=$cpus timeout=${timeout}s"
t0=$(date +%s%N)
# In the background, so that a signal to this script runs its traps at once
# (cleanup stops timeout(1), which passes the signal on to qemu).
timeout --foreground -k 5 "$timeout" "${qemu[@]}" </dev/null &
qpid=$!
pids=("$qpid" "${pids[@]}")
qrc=0
wait "$qpid" || qrc=$?
# If qemu never opened the FIFOs, open them once so the readers see EOF.
for f in stdout stderr; do exec {fd}<>"$s/$f"; exec {fd}>&-; done
wait "${pids[@]}" 2>/dev/null || true
pids=()
[[ $verbose == 1 ]] && say "qemu exited $qrc after $((($(date +%s%N) - t0) / 1000000)) ms"
[[ $verbose == 1 ]] && sed 's/^/[console] /' "$s/console.log" >&2

if [[ -s $s/rc ]]; then exit "$(cat "$s/rc")"; fi
if [[ $qrc == 124 || $qrc == 137 ]]; then
  # What the guest's kernel last said (hung tasks, an oops, the OOM killer
  # at its console level) is the only diagnosis a frozen guest leaves.
  say "timed out after ${timeout}s; the guest console's last lines:"
  tail -n 40 "$s/console.log" >&2
  exit 124
fi
say "the guest reported no exit status (qemu exit $qrc); console:"
tail -n 40 "$s/console.log" >&2
exit 125
