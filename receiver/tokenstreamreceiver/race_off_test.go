//go:build !race

package tokenstreamreceiver

// raceEnabled: the race detector allocates on its own account, so
// allocation counts mean nothing under it.
const raceEnabled = false
