package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

// runKubectl runs kubectl (the same release as the control plane) with args,
// exactly as k8s.io/kubernetes/cmd/kubectl does. It exits the process on error.
func runKubectl(args []string) {
	// kubectl reads os.Args itself (plugin lookup, verbosity, cobra), so make
	// it look like a plain `kubectl ARGS...` invocation.
	os.Args = append([]string{"kubectl"}, args...)
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
