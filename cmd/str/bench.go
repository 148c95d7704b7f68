package main

import "fmt"

// cmdBench is filled in by the benchmark work (make bench).
func cmdBench(args []string) int {
	fmt.Println("str bench: use make bench")
	return 2
}
