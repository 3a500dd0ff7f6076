// Package watch turns filesystem changes under a few paths into debounced triggers. It
// watches each path and its parent directory, so a directory or file that is removed,
// re-created or swapped in by a symlink rename (ConfigMap's ..data) is followed; a
// recursive path is watched with its subdirectories (CRI-O reads crio.conf.d recursively).
package watch
