package calendar

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// MaxZoneLen bounds a time zone's name (the longest of the time zone
// database is 32 bytes).
const MaxZoneLen = 64

// ErrZoneName is a name that is not the name of a zone of the time zone
// database.
var ErrZoneName = errors.New("must name a time zone of the time zone database, such as \"Europe/Berlin\" or \"UTC\"")

// loaded holds the zones LoadZone loaded, by name: only names that loaded,
// so at most the database's zones, whatever clients send; each request
// naming a zone then reads no file.
var loaded sync.Map

// LoadZone loads a zone of the time zone database by its name
// ("Europe/Berlin", "UTC", "Etc/GMT+5"). A client's name is checked
// before any file is opened: at most MaxZoneLen bytes, parts of letters,
// digits, '_', '-' and '+' that begin with a letter, separated by single
// '/'. So no path tricks ("../", "./", "//", a leading '/'), and none of
// the machine's own files that are not zones of the database everywhere:
// "Local", "localtime" and "posixrules" (the machine's zone), and the
// "posix/" and "right/" copies (the latter counting leap seconds).
func LoadZone(name string) (*time.Location, error) {
	if v, ok := loaded.Load(name); ok {
		return v.(*time.Location), nil
	}
	if !zoneName(name) {
		return nil, ErrZoneName
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q", name)
	}
	v, _ := loaded.LoadOrStore(name, loc)
	return v.(*time.Location), nil
}

func zoneName(name string) bool {
	if name == "" || len(name) > MaxZoneLen {
		return false
	}
	switch name {
	case "Local", "localtime", "posixrules":
		return false
	}
	if strings.HasPrefix(name, "posix/") || strings.HasPrefix(name, "right/") {
		return false
	}
	for part := range strings.SplitSeq(name, "/") {
		if part == "" || !letter(part[0]) {
			return false
		}
		for i := 1; i < len(part); i++ {
			if c := part[i]; !letter(c) && !('0' <= c && c <= '9') && c != '_' && c != '-' && c != '+' {
				return false
			}
		}
	}
	return true
}

func letter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
