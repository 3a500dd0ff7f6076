package kubelet

// Reader reads what the node's kubelet will do at pod start with images already on the
// node: its config with its drop-ins, the records of its own pulls under its root
// directory and, when neither the config nor the records say whether
// KubeletEnsureSecretPulledImages is on, its version. The daemon reads it every few
// minutes and imagepinctl check once: both through Read, and both decide with
// Verification.Decide.
type Reader struct {
	ConfigFile, ConfigDir, RootDir string
	// Version tells the kubelet's version; nil: not known.
	Version VersionSource
}

// Read reads the files, and the version only when the gate depends on it (no process is
// run on a node whose config or records already say).
func (r Reader) Read() (Verification, error) {
	kc, err := LoadConfig(r.ConfigFile, r.ConfigDir)
	if err != nil {
		return Verification{}, err
	}
	records, err := ReadPullRecords(r.RootDir)
	if err != nil {
		return Verification{}, err
	}
	var version Version
	if _, set := kc.FeatureGates[FeatureGate]; !set && !records.Enabled && r.Version != nil {
		version = r.Version.KubeletVersion()
	}
	return NewVerification(kc, records, version)
}
