// Command release holds the repository's release steps, in a module of its
// own so that the core never requires golang.org/x/mod or golang.org/x/exp.
//
//	go run . prepare [-root DIR] VERSION
//
// rewrites, in place, the go.mod of every module that is released with the
// core (every module of go.work outside examples/, bench/, integration/ and
// internal/): each requirement of a module of this repository names VERSION, the
// replace directives that point at this tree are dropped, and go.sum gains
// the hashes of those modules at VERSION, computed from the tree's tracked
// files as the module proxy will compute them from the tags. It then prints the tags to make.
// The tree must be clean, so that the hashes are those of the commit
// that is tagged.
//
//	go run . proxy [-root DIR] -version VERSION -out DIR
//
// writes a file-based GOPROXY (GOPROXY=file:///DIR) holding every released
// module of the tree at VERSION, as the module proxy would serve them from
// the tags.
//
//	go run . apidiff [-root DIR]
//
// compares the exported API of each released module with that of its last
// tag (v1.2.3 for the core, cli/v1.2.3 for the module in cli) and fails
// on an incompatible change; a module with no tag yet is skipped, saying so.
//
// The tests (make test-release) prove the result of prepare installs: they
// prepare a copy of the tree at a fake version, serve it from a file-based
// GOPROXY, and go install cmd/effectively from it with GOWORK=off.
package main
