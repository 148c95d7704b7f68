#!/usr/bin/env python3
"""Writes deploy/docker/seccomp.json, the container seccomp profile of the
str worker (docker run --security-opt seccomp=deploy/docker/seccomp.json).

The profile restates, in our own words, the rules of Docker's default
profile as Docker documents them (docs.docker.com, "Seccomp security
profiles for Docker": every syscall allowed except the listed ones; the
namespace and mount calls allowed only to a container with CAP_SYS_ADMIN),
then adds exactly the calls str's launcher makes that Docker's default
refuses even with CAP_SYS_ADMIN. Each rule carries its reason in "comment".

The syscall table is the build host's <asm/unistd_64.h> (x86_64); run
  python3 scripts/container-seccomp.py > deploy/docker/seccomp.json
after changing a list below. test/container checks the file is current.
"""
import json
import re
import sys

UNISTD = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"

# Refused by Docker's default profile for every container (no capability
# lifts them), as documented: kernel modules, kexec, clocks, swap, reboot,
# keyrings, NUMA policy, accounting, obsolete calls, cross-process memory.
REFUSED = """
acct add_key bpf clock_adjtime clock_settime create_module delete_module
finit_module get_kernel_syms get_mempolicy init_module ioperm iopl kcmp
kexec_file_load kexec_load keyctl lookup_dcookie mbind move_pages
nfsservctl open_by_handle_at perf_event_open process_vm_readv
process_vm_writev ptrace query_module quotactl quotactl_fd reboot
request_key set_mempolicy set_mempolicy_home_node settimeofday swapon swapoff sysfs _sysctl
uselib userfaultfd ustat vm86 vm86old syslog vhangup fanotify_init
name_to_handle_at io_uring_setup io_uring_enter io_uring_register
personality clone clone3
""".split()

# Allowed by Docker's default profile only to a container given
# CAP_SYS_ADMIN (its "includes caps" rules). The str worker runs with
# CAP_SYS_ADMIN, so these are allowed under the same condition here.
SYS_ADMIN_ONLY = {
    "clone": "a new sandbox: clone with CLONE_NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS|NEWCGROUP|NEWNET (Docker: CAP_SYS_ADMIN only)",
    "clone3": "Go's runtime and the launcher may use clone3 with namespace flags (Docker: ENOSYS without CAP_SYS_ADMIN)",
    "unshare": "the launcher's helper and the egress setup unshare namespaces (Docker: CAP_SYS_ADMIN only)",
    "setns": "joining a sandbox's network namespace for its egress proxy (Docker: CAP_SYS_ADMIN only)",
    "mount": "the sandbox's root: bind mounts, tmpfs, a fresh /proc; and the worker's cgroup remount (Docker: CAP_SYS_ADMIN only)",
    "umount2": "detaching the old root after pivot_root (Docker: CAP_SYS_ADMIN only)",
    "sethostname": "the sandbox's own UTS namespace gets the hostname \"sandbox\" (Docker: CAP_SYS_ADMIN only)",
    "setdomainname": "kept with sethostname, as Docker groups them (CAP_SYS_ADMIN only)",
}

# Refused by Docker's default profile even with CAP_SYS_ADMIN, and made by
# str's launcher (launcher/ and nsinit/). Allowed with CAP_SYS_ADMIN only.
STR_ADDS = {
    "pivot_root": "nsinit step 6: the sandbox's root becomes its own tmpfs; the old root is then detached (Docker's default lacks it at all)",
    "open_tree": "the launcher clones each bind source (OPEN_TREE_CLONE) on the host side and hands the detached tree to the sandbox",
    "move_mount": "attaches a cloned tree (open_tree) at its place in the sandbox's root",
    "mount_setattr": "makes the sandbox's mounts read-only/nosuid/nodev recursively (MOUNT_ATTR_*, AT_RECURSIVE)",
}

# personality: Docker allows these personas only (linux, linux32, with
# ADDR_NO_RANDOMIZE off, and the query 0xffffffff).
# CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET.
CLONE_NS_FLAGS = 0x7E020000

PERSONAS = [0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF]


def main():
    names = sorted(set(re.findall(r"#define __NR_(\w+) \d+", open(UNISTD).read())))
    plain = [n for n in names if n not in REFUSED and n not in SYS_ADMIN_ONLY and n not in STR_ADDS]
    rules = [{
        "names": plain,
        "action": "SCMP_ACT_ALLOW",
        "comment": "Docker's default: every syscall but the refused ones and the CAP_SYS_ADMIN ones below",
    }]
    for p in PERSONAS:
        rules.append({"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                      "args": [{"index": 0, "value": p, "op": "SCMP_CMP_EQ"}],
                      "comment": "Docker's default: these personas only"})
    # Without CAP_SYS_ADMIN (the same profile on other containers): threads
    # and processes, not namespaces; clone3's flags live in memory seccomp
    # cannot read, so it answers ENOSYS and libc falls back to clone.
    rules.append({"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                  "args": [{"index": 0, "value": CLONE_NS_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
                  "excludes": {"caps": ["CAP_SYS_ADMIN"]},
                  "comment": "Docker's default: clone without namespace flags when CAP_SYS_ADMIN is absent"})
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38,
                  "excludes": {"caps": ["CAP_SYS_ADMIN"]},
                  "comment": "Docker's default: ENOSYS without CAP_SYS_ADMIN, so that libc uses clone"})
    for table in (SYS_ADMIN_ONLY, STR_ADDS):
        for n, why in table.items():
            rules.append({"names": [n], "action": "SCMP_ACT_ALLOW",
                          "includes": {"caps": ["CAP_SYS_ADMIN"]}, "comment": why})
    prof = {
        "comment": "str worker container profile: generated by scripts/container-seccomp.py; do not edit",
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    }
    json.dump(prof, sys.stdout, indent=1)
    sys.stdout.write("\n")


main()
