package main

import (
	"strings"
	"testing"

	"github.com/securetoolruntime/str/launcher"
)

func TestProcOvermounts(t *testing.T) {
	mi := "22 1 0:21 / /proc rw - proc proc rw\n" +
		"23 22 0:22 / /proc/sys/fs/binfmt_misc rw - autofs systemd-1 rw\n" +
		"90 22 0:5 /null /proc/kcore ro - devtmpfs udev rw\n" +
		"91 22 0:60 / /proc/acpi ro - tmpfs tmpfs ro\n"
	if got := procOvermounts(mi); strings.Join(got, ",") != "/proc/kcore,/proc/acpi" {
		t.Fatalf("masked /proc paths: %v", got)
	}
	if got := accountsInRange("root:x:0:0::/:/bin/sh\nodd:x:1879048200:1::/:/bin/sh\n", launcher.DefaultIDRange); len(got) != 1 || got[0] != "odd=1879048200" {
		t.Fatalf("accounts in range: %v", got)
	}
}
