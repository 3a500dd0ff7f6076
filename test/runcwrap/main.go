// Command runcwrap runs runc after dropping linux.resources.hugepageLimits from the
// bundle's config.json. The kubelet asks for a 0-byte hugetlb limit per page size;
// CRI-O passes it on because /proc/cgroups lists hugetlb, but the test machines mount no
// hugetlb hierarchy, so runc would fail to join the cgroup. Test support only: the
// end-to-end tier registers it as CRI-O's runc (env.CRIOOptions.RunContainers).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// runc is the real runc, set at build time (-ldflags -X main.runc=PATH).
var runc = "/usr/sbin/runc"

func main() {
	args := os.Args[1:]
	for i, a := range args {
		var bundle string
		switch {
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			bundle = args[i+1]
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		}
		if bundle != "" {
			if err := dropHugepageLimits(filepath.Join(bundle, "config.json")); err != nil {
				fmt.Fprintln(os.Stderr, "runcwrap:", err)
				os.Exit(1)
			}
		}
	}
	err := syscall.Exec(runc, append([]string{runc}, args...), os.Environ())
	fmt.Fprintln(os.Stderr, "runcwrap: exec", runc+":", err)
	os.Exit(1)
}

func dropHugepageLimits(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return err
	}
	linux, _ := spec["linux"].(map[string]any)
	res, _ := linux["resources"].(map[string]any)
	if _, ok := res["hugepageLimits"]; !ok {
		return nil
	}
	delete(res, "hugepageLimits")
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	tmp := path + ".runcwrap"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
