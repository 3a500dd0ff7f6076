package image

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
)

// machine is what a GOARCH's ELF header says.
type machine struct {
	machine elf.Machine
	order   binary.ByteOrder
}

var machines = map[string]machine{
	"amd64":   {elf.EM_X86_64, binary.LittleEndian},
	"arm64":   {elf.EM_AARCH64, binary.LittleEndian},
	"ppc64le": {elf.EM_PPC64, binary.LittleEndian},
	"s390x":   {elf.EM_S390, binary.BigEndian},
}

// checkELF says whether r is a 64-bit static ELF executable for the GOARCH arch: its
// machine and byte order, and no program interpreter (a dynamic binary would not start on
// an empty base).
func checkELF(r io.ReaderAt, arch string) error {
	want, ok := machines[arch]
	if !ok {
		return fmt.Errorf("unknown architecture %q", arch)
	}
	f, err := elf.NewFile(r)
	if err != nil {
		return fmt.Errorf("not an ELF file: %w", err)
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Machine != want.machine || f.ByteOrder != want.order {
		return fmt.Errorf("ELF for %s %s %s, linux/%s needs %s %s %s", f.Class, f.Machine, f.Data, arch, elf.ELFCLASS64, want.machine, dataOf(want.order))
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %s, not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked (has a program interpreter): build with CGO_ENABLED=0")
		}
	}
	return nil
}

func dataOf(o binary.ByteOrder) elf.Data {
	if o == binary.BigEndian {
		return elf.ELFDATA2MSB
	}
	return elf.ELFDATA2LSB
}
