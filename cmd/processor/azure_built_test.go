//go:build !noazure

package main

// azureBuilt says whether this build has the azblob:// driver (azure.go).
const azureBuilt = true
