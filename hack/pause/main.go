// Command pause is the sandbox process of every pod on the local cluster's real node. It stands in for
// registry.k8s.io/pause, which cannot be pulled here: it holds the pod's namespaces open, reaps the zombies of a
// shared PID namespace, and exits on SIGINT or SIGTERM. hack/images.sh builds it into an image of its own.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reapChildren()
	}
}

// reapChildren waits for every exited child without blocking: one SIGCHLD can stand for several exits.
func reapChildren() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
