// Package jsonscan reads the JSON our own writers produce, without
// reflection, for decoders that take a fast path through documents
// they know and hand anything else to encoding/json (inventory.Decode,
// the client's assignment decoder). Each method reads one value at Pos
// and says whether it could; false means "not the plain form: leave the
// whole document to encoding/json", never "invalid", so a Scanner
// judges nothing and its callers' errors stay encoding/json's.
package jsonscan

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// Scanner is a position in one document. Used by one goroutine.
type Scanner struct {
	Data []byte
	Pos  int
}

// Space skips white space.
func (d *Scanner) Space() {
	for d.Pos < len(d.Data) {
		switch d.Data[d.Pos] {
		case ' ', '\t', '\n', '\r':
			d.Pos++
		default:
			return
		}
	}
}

// End says nothing but space is left.
func (d *Scanner) End() bool {
	d.Space()
	return d.Pos == len(d.Data)
}

// Byte reads c, after space.
func (d *Scanner) Byte(c byte) bool {
	d.Space()
	if d.Pos < len(d.Data) && d.Data[d.Pos] == c {
		d.Pos++
		return true
	}
	return false
}

// Peek is the next byte after space (0 at the end).
func (d *Scanner) Peek() byte {
	d.Space()
	if d.Pos < len(d.Data) {
		return d.Data[d.Pos]
	}
	return 0
}

// Raw reads a string without escapes or control characters, valid
// UTF-8, and returns its contents (quotes excluded), sharing Data.
func (d *Scanner) Raw() ([]byte, bool) {
	if !d.Byte('"') {
		return nil, false
	}
	start, ascii := d.Pos, true
	for d.Pos < len(d.Data) {
		c := d.Data[d.Pos]
		switch {
		case c == '"':
			s := d.Data[start:d.Pos]
			d.Pos++
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
		d.Pos++
	}
	return nil, false
}

// Str reads a string into a string of its own.
func (d *Scanner) Str(out *string) bool {
	s, ok := d.Raw()
	if ok {
		*out = string(s)
	}
	return ok
}

// Number reads a number literal as JSON's grammar has it; integer says
// it had neither fraction nor exponent.
func (d *Scanner) Number() (lit []byte, integer, ok bool) {
	d.Space()
	start := d.Pos
	digits := func() int {
		n := 0
		for d.Pos < len(d.Data) && d.Data[d.Pos] >= '0' && d.Data[d.Pos] <= '9' {
			d.Pos++
			n++
		}
		return n
	}
	if d.Pos < len(d.Data) && d.Data[d.Pos] == '-' {
		d.Pos++
	}
	first := d.Pos
	n := digits()
	if n == 0 || n > 1 && d.Data[first] == '0' {
		return nil, false, false
	}
	integer = true
	if d.Pos < len(d.Data) && d.Data[d.Pos] == '.' {
		d.Pos++
		if digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	if d.Pos < len(d.Data) && (d.Data[d.Pos] == 'e' || d.Data[d.Pos] == 'E') {
		d.Pos++
		if d.Pos < len(d.Data) && (d.Data[d.Pos] == '+' || d.Data[d.Pos] == '-') {
			d.Pos++
		}
		if digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	return d.Data[start:d.Pos], integer, true
}

// Int reads an integer as encoding/json reads one into an int: no
// fraction or exponent, in range.
func (d *Scanner) Int(out *int) bool {
	lit, integer, ok := d.Number()
	if !ok || !integer {
		return false
	}
	n, err := strconv.ParseInt(string(lit), 10, strconv.IntSize)
	*out = int(n)
	return err == nil
}

// Uint reads an unsigned integer of bits bits as encoding/json reads
// one: no sign, fraction or exponent, in range.
func (d *Scanner) Uint(out *uint64, bits int) bool {
	lit, integer, ok := d.Number()
	if !ok || !integer || lit[0] == '-' {
		return false
	}
	n, err := strconv.ParseUint(string(lit), 10, bits)
	*out = n
	return err == nil
}

// Float reads a number as encoding/json reads one into a float64.
func (d *Scanner) Float(out *float64) bool {
	lit, _, ok := d.Number()
	if !ok {
		return false
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	*out = f
	return err == nil
}

// Bool reads true or false.
func (d *Scanner) Bool(out *bool) bool {
	switch {
	case d.literal("true"):
		*out = true
	case d.literal("false"):
		*out = false
	default:
		return false
	}
	return true
}

// Null reads null.
func (d *Scanner) Null() bool { return d.literal("null") }

func (d *Scanner) literal(s string) bool {
	d.Space()
	if len(d.Data)-d.Pos >= len(s) && string(d.Data[d.Pos:d.Pos+len(s)]) == s {
		d.Pos += len(s)
		return true
	}
	return false
}

// Object reads an object, calling field with each key (the value is
// field's to read). In a struct's object (fields: the most keys it may
// hold) a key seen twice is left to encoding/json, which merges such
// values in ways not worth copying; a map's (fields 0) takes the last,
// as encoding/json does.
func (d *Scanner) Object(fields int, field func(key []byte) bool) bool {
	if !d.Byte('{') {
		return false
	}
	if d.Byte('}') {
		return true
	}
	var seen [16][]byte
	n := 0
	for {
		key, ok := d.Raw()
		if !ok || !d.Byte(':') {
			return false
		}
		if fields > 0 {
			for _, s := range seen[:n] {
				if string(s) == string(key) {
					return false
				}
			}
			if n == len(seen) || n == fields {
				return false
			}
			seen[n] = key
			n++
		}
		if !field(key) {
			return false
		}
		if d.Byte('}') {
			return true
		}
		if !d.Byte(',') {
			return false
		}
	}
}

// Array reads an array (not null), calling elem for each element.
func (d *Scanner) Array(elem func() bool) bool {
	if !d.Byte('[') {
		return false
	}
	if d.Byte(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.Byte(']') {
			return true
		}
		if !d.Byte(',') {
			return false
		}
	}
}

// Elems guesses how many elements the array at Pos has, from its commas
// up to the first ']' (exact for numbers and plain strings): a capacity,
// so that a list is not grown through several arrays.
func (d *Scanner) Elems() int {
	end := bytes.IndexByte(d.Data[d.Pos:], ']')
	if end < 0 {
		return 0
	}
	return bytes.Count(d.Data[d.Pos:d.Pos+end], []byte{','}) + 1
}
