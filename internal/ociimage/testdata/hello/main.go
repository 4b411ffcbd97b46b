// Command hello is the smallest image the ociimage tests build.
package main

import "fmt"

func main() { fmt.Println("hello") }
