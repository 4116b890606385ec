// Large table values are declared to BCC as bytes.
//
// BCC (0.26, and every Python BPF object) compiles, next to the programs, a text reader and writer of each
// table's key and value type (its "rw engine"): one sscanf/snprintf argument per element of an array that is
// not of bytes, all run through the optimizer. For the stack store's 4,608-word chunks that was 0.35 s of
// the compile here; a byte array is one "%s". So a table whose value is a large struct holds
// TABLE_BYTES(tag), struct tag's size in bytes, and its lookups cast back to struct tag: the kernel sees the
// same value size, and nothing in the frontend reads these values by field.
// loader.py puts this file before the program.

// (The size is an enum constant: with sizeof(...) as an array's size, BCC's JSON description of the type,
// which Python's table classes are built from, is not valid JSON.)
#define TABLE_BYTES(tag)                          \
    enum { tag##_size = sizeof(struct tag) };     \
    struct tag##_bytes { u8 bytes[tag##_size]; }
