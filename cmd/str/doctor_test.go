package main

import (
	"testing"

	"github.com/securetoolruntime/str/launcher"
)

func TestAccountsInRange(t *testing.T) {
	if got := accountsInRange("root:x:0:0::/:/bin/sh\nodd:x:1879048200:1::/:/bin/sh\n", launcher.DefaultIDRange); len(got) != 1 || got[0] != "odd=1879048200" {
		t.Fatalf("accounts in range: %v", got)
	}
}
