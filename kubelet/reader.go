package kubelet

// Reader reads what the node's kubelet will do at pod start with images already on the
// node: its config with its drop-ins, the records of its own pulls under its root
// directory and its version, when neither the config nor the records say whether
// KubeletEnsureSecretPulledImages is on, or when the answer depends on how the kubelet
// names images (it changed in 1.36: a record of its own pull, an allowlist). The daemon reads it every few
// minutes and imagepinctl check once: both through Read, and both decide with
// Verification.Decide.
type Reader struct {
	ConfigFile, ConfigDir, RootDir string
	// Version tells the kubelet's version; nil: not known.
	Version VersionSource
}

// Read reads the files, and the version only when the answer depends on it (no process
// is run on a node whose config says the kubelet verifies nothing).
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
	on, set := kc.FeatureGates[FeatureGate]
	policy := kc.ImagePullCredentialsVerificationPolicy
	naming := (!set || on) && policy != NeverVerify &&
		(policy == NeverVerifyAllowlistedImages || len(records.Pulled) > 0)
	if r.Version != nil && ((!set && !records.Enabled) || naming) {
		version = r.Version.KubeletVersion()
	}
	return NewVerification(kc, records, version)
}
