package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "prepare":
		err = runPrepare(args)
	case "proxy":
		err = runProxy(args)
	case "apidiff":
		err = runAPIDiff(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "release %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  release prepare [-root DIR] [-allow-dirty] VERSION
  release proxy [-root DIR] -version VERSION -out DIR
  release apidiff [-root DIR]
`)
	os.Exit(2)
}
