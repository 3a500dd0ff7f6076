// Command podapp is the process of the end-to-end tier's pods: a static binary that
// says it started (in the container's log) and sleeps until stopped. Test support only.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	fmt.Println("imagepin pod started:", os.Getenv("HOSTNAME"))
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
