package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Network indices are handed out in blocks, each guarded by an advisory
// file lock held for the fleet's life, so concurrent fleets on one machine
// (other processes included) never share a loopback range. The kernel drops
// the lock when the process dies, however it dies.
const (
	networksPerBlock = 8
	networkBlocks    = 100 / networksPerBlock
)

// reserveNetworks finds consecutive free blocks for n spokes and returns the
// first network index and the held locks. Index 0 is never handed out: it
// means "reserve automatically" in Options.
func reserveNetworks(n int) (int, []*os.File, error) {
	need := (n + networksPerBlock) / networksPerBlock // one spare index: 0 is reserved
	for start := 0; start+need <= networkBlocks; start++ {
		var locks []*os.File
		ok := true
		for b := start; b < start+need; b++ {
			f, err := lockBlock(b)
			if err != nil {
				ok = false
				break
			}
			locks = append(locks, f)
		}
		if ok {
			return start*networksPerBlock + 1, locks, nil
		}
		releaseNetworks(locks)
	}
	return 0, nil, fmt.Errorf("no free loopback networks for %d spokes: too many fleets running on this machine", n)
}

func lockBlock(b int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("fleetinfer-network-block-%d.lock", b)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func releaseNetworks(locks []*os.File) {
	for _, f := range locks {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}
}
