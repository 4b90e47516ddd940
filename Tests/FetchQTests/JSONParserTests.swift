import CJansson
import Testing

@testable import FetchQ

@Suite struct JSONParserTests {
    func nested(_ depth: Int, open: String = "[", close: String = "]", inner: String = "")
        -> String
    {
        String(repeating: open, count: depth) + inner + String(repeating: close, count: depth)
    }

    func parseError(_ text: String, maxDepth: Int = 64) -> JSONParseError? {
        do {
            let value = try JSONParser.parse(text, maxDepth: maxDepth)
            Issue.record("expected an error, got \(value.dumps())")
            return nil
        } catch {
            return error
        }
    }

    func parseError(bytes: [UInt8], maxDepth: Int = 64) -> JSONParseError? {
        do {
            let value = try JSONParser.parse(bytes, maxDepth: maxDepth)
            Issue.record("expected an error, got \(value.dumps())")
            return nil
        } catch {
            return error
        }
    }

    @Test func topLevelScalarsParse() throws {
        #expect(try JSONParser.parse("42", maxDepth: 0).integerValue == 42)
        #expect(try JSONParser.parse(" -1.5e2 ", maxDepth: 0).doubleValue == -150)
        #expect(try JSONParser.parse("\"x\"", maxDepth: 0).stringValue == "x")
        #expect(try JSONParser.parse("null", maxDepth: 0).isNull)
        #expect(try JSONParser.parse("true", maxDepth: 0).boolValue == true)
    }

    @Test func escapedNulInStringIsKept() throws {
        let value = try JSONParser.parse(#"["a\u0000b"]"#, maxDepth: 4)
        let string = try #require(value[0]?.stringValue)
        #expect(Array(string.utf8) == [0x61, 0x00, 0x62])
        #expect(value.dumps() == #"["a\u0000b"]"#)
    }

    @Test(arguments: [0, 1, 2, 17, 100])
    func arrayDepthLimitIsExact(maxDepth: Int) throws {
        let ok = try JSONParser.parse(nested(maxDepth, inner: "1"), maxDepth: maxDepth)
        #expect(ok.dumps().count == 2 * maxDepth + 1)
        let error = try #require(parseError(nested(maxDepth + 1, inner: "1"), maxDepth: maxDepth))
        #expect(error.kind == .depth)
        #expect(error.message.contains("\(maxDepth)"))
        // Located at the first bracket past the limit, as jansson locates its own.
        #expect(error.line == 1)
        #expect(error.position == maxDepth + 1)
        #expect(error.column == maxDepth + 1)
    }

    @Test func objectAndMixedDepthLimitIsExact() throws {
        // {"a":{"a":{"a":1}}} has depth 3.
        let objects = nested(3, open: #"{"a":"#, close: "}", inner: "1")
        #expect(try JSONParser.parse(objects, maxDepth: 3).dumps() == #"{"a":{"a":{"a":1}}}"#)
        #expect(parseError(objects, maxDepth: 2)?.kind == .depth)
        let mixed = #"[{"a":[{"b":[]}]}]"#  // depth 5
        #expect(try JSONParser.parse(mixed, maxDepth: 5).count == 1)
        #expect(parseError(mixed, maxDepth: 4)?.kind == .depth)
        // Siblings do not add up: depth is nesting, not the number of containers.
        #expect(try JSONParser.parse("[[],[],[],{},{}]", maxDepth: 2).count == 5)
    }

    @Test func bracketsInsideStringsDoNotCount() throws {
        let text = #"["[[[[{{{{", "\"[[[[", "\\", "{\\\"[[", "]]]]"]"#
        let value = try JSONParser.parse(text, maxDepth: 1)
        #expect(value.count == 5)
        #expect(value[1]?.stringValue == "\"[[[[")
        #expect(value[2]?.stringValue == "\\")
        #expect(value[3]?.stringValue == "{\\\"[[")
        // A key that looks like brackets, too.
        #expect(try JSONParser.parse(#"{"[[[":"{{{"}"#, maxDepth: 1).count == 1)
    }

    @Test func janssonsOwnLimitIsReportedAsDepth() throws {
        #expect(JSONParser.janssonMaxDepth == 2048)
        let limit = JSONParser.janssonMaxDepth
        let ok = try JSONParser.parse(nested(limit), maxDepth: 1_000_000)
        #expect(ok.isArray)
        let error = try #require(parseError(nested(limit + 1), maxDepth: 1_000_000))
        #expect(error.kind == .depth)
        #expect(error.message.contains("maximum parsing depth"))  // jansson's text
        #expect(error.position == limit + 1)
    }

    @Test func emptyInput() throws {
        let none = try #require(parseError(""))
        #expect(none.kind == .empty)
        #expect(none.position == 0)
        let blank = try #require(parseError(" \t\r\n  "))
        #expect(blank.kind == .empty)
        #expect(blank.line == 2)
        #expect(blank.position == 6)
        #expect(parseError(bytes: [])?.kind == .empty)
    }

    @Test func syntaxErrorsCarryJanssonsMessageAndLocation() throws {
        let error = try #require(parseError("[1,\n  x]"))
        #expect(error.kind == .syntax)
        #expect(error.message == "invalid token near 'x'")
        #expect(error.line == 2)
        #expect(error.column == 3)
        #expect(error.position == 7)
        #expect(error.description == "invalid token near 'x' (line 2, column 3, byte 7)")

        #expect(parseError("[1] [2]")?.message.contains("end of file expected") == true)
        #expect(parseError("[1,]")?.kind == .syntax)
        #expect(parseError("{\"a\" 1}")?.kind == .syntax)
        #expect(parseError("\"abc")?.kind == .syntax)
    }

    @Test func rawNulBytesAreRejected() throws {
        // jansson alone accepts "123\0" (the number lexer stops at the NUL).
        let afterNumber = try #require(parseError(bytes: Array("123".utf8) + [0]))
        #expect(afterNumber.kind == .syntax)
        #expect(afterNumber.position == 4)
        #expect(afterNumber.message.contains("NUL"))
        #expect(parseError(bytes: [0x22, 0x61, 0x00, 0x22])?.kind == .syntax)  // "a<NUL>"
        #expect(parseError(bytes: [0x5B, 0x00, 0x5D])?.kind == .syntax)  // [<NUL>]
    }

    @Test func invalidUTF8IsRejected() throws {
        let cases: [[UInt8]] = [
            [0x22, 0xFF, 0x22],  // never valid
            [0x22, 0xC0, 0xAF, 0x22],  // overlong "/"
            [0x22, 0xED, 0xA0, 0x80, 0x22],  // encoded surrogate U+D800
            [0x22, 0xE6, 0x97, 0x22],  // truncated sequence
            [0x22, 0xF4, 0x90, 0x80, 0x80, 0x22],  // above U+10FFFF
        ]
        for bytes in cases {
            #expect(parseError(bytes: bytes)?.kind == .invalidUTF8, "\(bytes)")
        }
        // Valid multi-byte UTF-8 passes, and the column counts characters.
        #expect(try JSONParser.parse(#"["日本", "é", "😀"]"#, maxDepth: 1).count == 3)
        #expect(parseError("[\"日本\", x]")?.column == 8)
    }

    @Test func unrepresentableNumbersAreUnsupported() throws {
        let big = try #require(parseError("[123456789012345678901234567890]"))
        #expect(big.kind == .unsupported)
        #expect(big.message.contains("too big integer"))
        #expect(parseError("1e400")?.kind == .unsupported)
        #expect(try JSONParser.parse("9223372036854775807", maxDepth: 0).integerValue == .max)
        #expect(try JSONParser.parse("-9223372036854775808", maxDepth: 0).integerValue == .min)
    }

    @Test func nulInObjectKeyIsUnsupported() throws {
        let error = try #require(parseError(#"{"a\u0000b": 1}"#))
        #expect(error.kind == .unsupported)
        #expect(error.message.contains("NUL byte in object key not supported"))
    }

    @Test func duplicateKeysKeepTheLast() throws {
        let value = try JSONParser.parse(#"{"a":1,"a":2}"#, maxDepth: 1)
        #expect(value.count == 1)
        #expect(value["a"]?.integerValue == 2)
    }

    @Test func negativeMaxDepthMeansScalarsOnly() throws {
        #expect(try JSONParser.parse("1", maxDepth: -5).integerValue == 1)
        #expect(parseError("[]", maxDepth: -5)?.kind == .depth)
    }

    @Test func bufferEntryPointReadsOnlyTheGivenBytes() throws {
        let bytes = Array("[1][2]".utf8)
        let value = try bytes.withUnsafeBytes { raw in
            try JSONParser.parse(UnsafeRawBufferPointer(rebasing: raw[0..<3]), maxDepth: 1)
        }
        #expect(value.dumps() == "[1]")
    }

    /// jansson reports some failed allocations as syntax errors ("string or
    /// '}' expected"): a text the allocation-free check finds valid failed
    /// for want of memory (a review saw valid bodies reported "not valid
    /// JSON" under `ulimit -v`).
    @Test func aValidTextThatJanssonFailedOnIsOutOfMemory() {
        let valid = Array(#"{"id": [1, 2, {"a": "b"}]}"#.utf8)
        let invalid = Array(#"{"id": [1, 2,}"#.utf8)
        valid.withUnsafeBytes { raw in
            #expect(JSONParser.failureKind(json_error_invalid_syntax, raw, maxDepth: 64) == .outOfMemory)
            #expect(JSONParser.failureKind(json_error_out_of_memory, raw, maxDepth: 64) == .outOfMemory)
            #expect(JSONParser.failureKind(json_error_stack_overflow, raw, maxDepth: 64) == .depth)
        }
        invalid.withUnsafeBytes { raw in
            #expect(JSONParser.failureKind(json_error_invalid_syntax, raw, maxDepth: 64) == .syntax)
        }
    }
}
