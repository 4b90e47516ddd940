import CJansson
import FetchQ
import Glibc

/// Fails the run when an oracle does not hold: prints why, then aborts (libFuzzer
/// saves the input as a crash; a replay names the file).
func require(_ condition: Bool, _ message: @autoclosure () -> String,
             file: StaticString = #fileID, line: UInt = #line) {
    guard !condition else { return }
    let text = "fuzz oracle failed at \(file):\(line): \(message())\n"
    _ = text.withCString { write(2, $0, strlen($0)) }
    abort()
}

/// The compact, key-sorted JSON text of a value: the identity the engine uses for
/// de-duplication, computed here with jansson directly (independently of the engine's
/// fast paths).
func canonicalText(_ value: UnsafeMutablePointer<json_t>) -> [UInt8] {
    let flags = Int(JSON_COMPACT) | Int(JSON_SORT_KEYS) | Int(JSON_ENCODE_ANY)
    guard let text = json_dumps(value, flags) else { return [] }
    defer { free(text) }
    return Array(UnsafeRawBufferPointer(start: text, count: strlen(text)))
}

/// Nesting depth as JSONParser counts it: a scalar is 0, `[]` is 1.
func depth(of value: UnsafeMutablePointer<json_t>) -> Int {
    switch value.pointee.type {
    case JSON_ARRAY:
        var deepest = 0
        for i in 0..<json_array_size(value) { deepest = max(deepest, depth(of: json_array_get(value, i)!)) }
        return deepest + 1
    case JSON_OBJECT:
        var deepest = 0
        var iter = json_object_iter(value)
        while let it = iter {
            deepest = max(deepest, depth(of: json_object_iter_value(it)!))
            iter = json_object_iter_next(value, it)
        }
        return deepest + 1
    default:
        return 0
    }
}

/// Splits `data` at its first `count` newlines: `count` lines (UTF-8 decoded,
/// invalid bytes replaced) and the rest as bytes. Missing lines are nil.
func splitLines(_ data: UnsafeRawBufferPointer, count: Int) -> (lines: [String?], rest: UnsafeRawBufferPointer) {
    var lines: [String?] = []
    var start = 0
    for _ in 0..<count {
        guard let newline = data[start...].firstIndex(of: UInt8(ascii: "\n")) else {
            lines.append(nil)
            continue
        }
        lines.append(String(decoding: data[start..<newline], as: UTF8.self))
        start = newline + 1
    }
    return (lines, UnsafeRawBufferPointer(rebasing: data[start...]))
}
