package bucket

// Calendar is the kind of a fixed window whose windows follow a calendar
// (days, weeks, months in a time zone) rather than a grid: their lengths
// vary, so the caller, who has a time zone database, hands the store the
// window of the decision. Start is the window's start as an instant
// (nanoseconds since the epoch, not an offset), Period its length, and
// Rate equals Burst (every window starts full). The store decides as for
// a fixed window, with two rules more, so that a window of one length
// never refills on another's grid:
//
//   - a stored state from before Start is from an earlier window: the key
//     starts afresh (full);
//   - a decision whose time is before Start (a store clock behind the
//     caller's, which found the window begun) is made at Start.
//
// A store whose clock has passed the window's end decides in the next
// window on the window's grid: its start is right (the current window's
// end), and the next call's params carry its true length. Its waits
// (RetryAfter, ResetAfter) end on that grid; the caller moves them to the
// calendar (calendar.Period.Hint).
const Calendar Kind = 5

// calendarNow applies Calendar's rules to a decision on b (found) at now.
func (p Params) calendarNow(b State, found bool, now int64) (bool, int64) {
	if found && b.TS < p.Start {
		found = false
	}
	return found, max(now, p.Start)
}
