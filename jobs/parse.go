package jobs

import "strconv"

// parseInt is strconv.ParseInt(string(b), 10, 64) without the string: the
// conversion allocates (a failed parse keeps its input in the error), one
// allocation a record for the aggregate job. An optional sign and up to 18
// digits cannot overflow an int64 and are parsed here; anything else,
// errors included, goes to strconv, so results and errors are the same.
func parseInt(b []byte) (int64, error) {
	digits := b
	neg := false
	if len(digits) > 0 && (digits[0] == '-' || digits[0] == '+') {
		neg = digits[0] == '-'
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return strconv.ParseInt(string(b), 10, 64)
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return strconv.ParseInt(string(b), 10, 64)
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}
