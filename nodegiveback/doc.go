// Package nodegiveback gives a node back as it was before imagepind first ran
// (`imagepind uninstall`): the pins imagepind set released (the images stay), each
// runtime file imagepind wrote put back from its original record (package original), what
// no record covers taken out by what each writer knows of its own files, CRI-O reloaded
// once, the blob store and the state removed. What it leaves is a receipt in the state
// directory (given back, when, what was restored), which `imagepind uninstall --status`
// reads. Every step is idempotent: a run that stops part way is finished by the next.
package nodegiveback
