import CFetchQSupport
import CJansson
import Glibc
import Testing

@testable import FetchQ

/// `fqs_json_build` (C, Sources/CFetchQSupport/json_walk.c and json_builder.h), which `JSONParser.parse`
/// uses for valid input, against jansson's own parser: for every input, either both fail
/// or both give the same tree — same types, same members in the same order, the same
/// bytes in every string and the same bits in every real.
@Suite struct JSONBuilderTests {

    // MARK: - Helpers

    static func built(_ bytes: [UInt8], maxDepth: Int) -> JSONRef? {
        bytes.withUnsafeBufferPointer { buffer -> JSONRef? in
            guard let base = buffer.baseAddress, let raw = fqs_json_build(base, buffer.count, maxDepth) else {
                return nil
            }
            return JSONRef(stealing: raw.assumingMemoryBound(to: json_t.self))
        }
    }

    static func reference(_ bytes: [UInt8], maxDepth: Int) -> JSONRef? {
        bytes.withUnsafeBytes { try? JSONParser.parseWithJansson($0, maxDepth: maxDepth) }
    }

    /// The value as text that tells apart everything a tree can hold: keys in order,
    /// strings byte for byte (NUL as \u0000), integers from reals, and every real by its
    /// shortest round-tripping form (so -0.0 from 0.0 and any two doubles).
    static func exactText(_ value: JSONRef) -> String {
        let flags = Int(JSON_ENCODE_ANY) | Int(JSON_COMPACT) | Int(JSON_ESCAPE_SLASH) | (17 << 11)  // JSON_REAL_PRECISION(17)
        guard let text = json_dumps(value.pointer, flags) else { return "<json_dumps failed>" }
        defer { free(text) }
        return String(cString: text)
    }

    /// nil when they agree; otherwise what differs.
    static func difference(_ bytes: [UInt8], maxDepth: Int) -> String? {
        let mine = built(bytes, maxDepth: maxDepth)
        let theirs = reference(bytes, maxDepth: maxDepth)
        switch (mine, theirs) {
        case (nil, nil):
            return nil
        case (let mine?, let theirs?):
            let a = exactText(mine)
            let b = exactText(theirs)
            if a == b && json_equal(mine.pointer, theirs.pointer) == 1 { return nil }
            return "built \(a.prefix(300)) but jansson \(b.prefix(300))"
        case (nil, _?):
            return "declined what jansson parses"
        case (_?, nil):
            return "built what jansson rejects"
        }
    }

    /// Records an issue (with the input in hex) when they differ; returns whether jansson
    /// parsed it, or nil on a difference.
    @discardableResult
    static func agree(
        _ bytes: [UInt8], maxDepth: Int, _ label: String = "",
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> Bool? {
        if let difference = difference(bytes, maxDepth: maxDepth) {
            Issue.record(
                "\(label) maxDepth \(maxDepth): \(difference); input \(JSONValidatorTests.hex(bytes))",
                sourceLocation: sourceLocation)
            return nil
        }
        return reference(bytes, maxDepth: maxDepth) != nil
    }

    /// Compares at maxDepth 512 and counts the outcome; false once 20 inputs differed.
    static func tally(_ bytes: [UInt8], built: inout Int, mismatches: inout Int,
                      sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        switch agree(bytes, maxDepth: 512, sourceLocation: sourceLocation) {
        case true?: built += 1
        case false?: break
        case nil: mismatches += 1
        }
        return mismatches < 20
    }

    static func u(_ text: String) -> [UInt8] { Array(text.utf8) }

    // MARK: - The suite, the validator's cases

    @Test(arguments: JSONValidatorTests.depths) func everySuiteFileMatches(maxDepth: Int) throws {
        let files = try JSONValidatorTests.suiteFiles()
        var built = 0
        for (name, bytes) in files {
            if Self.agree(bytes, maxDepth: maxDepth, name) == true { built += 1 }
        }
        #expect(files.count == 318 + 22)
        #expect(built > (maxDepth >= 512 ? 100 : 50))
    }

    @Test func validatorCasesMatch() {
        var built = 0
        for (bytes, accepted) in JSONValidatorTests.scalarCases {
            for maxDepth in [0, 512] where Self.agree(bytes, maxDepth: maxDepth) == true {
                built += 1
            }
            #expect((Self.built(bytes, maxDepth: 512) != nil) == accepted, "\(JSONValidatorTests.hex(bytes))")
        }
        for (bytes, maxDepth, accepted) in JSONValidatorTests.depthCases {
            #expect(Self.agree(bytes, maxDepth: maxDepth) == accepted)
        }
        #expect(built > 200)  // 226: cases jansson parses, at maxDepth 0 and 512
    }

    // MARK: - What the builder does its own way

    /// Numbers on both sides of the one-step conversion (at most 19 significant digits,
    /// a mantissa below 2^53 and a power of ten within 10^±22), hand-picked.
    static let numberCases: [String] = [
        "0.1", "0.2", "0.3", "-0.0", "-0e0", "0e-5", "-0.000", "1.5", "64.281", "-12.5e+2", "1e22", "1e23",
        "1e-22", "1e-23", "9e22", "9e-22", "1.7976931348623157e308", "2.2250738585072014e-308",
        "4.9e-324", "2.4703282292062327e-324", "2.4703282292062328e-324",
        "9007199254740991.0", "9007199254740992.0", "9007199254740993.0", "9007199254740993e0",
        "900719925474099.3", "90071992547409.93e2", "0.9007199254740993", "9007199254740991e-22",
        "9007199254740991e22", "9007199254740992e-22", "1234567890123456789e0", "1234567890123456789.5",
        "12345678901234567890e-20", "0.00000000000000000001234567890123456789", "123456789012345678e-5",
        "3.141592653589793", "2.718281828459045235360287", "1.00000000000000011102230246251565404236316680908203125",
        "1.00000000000000011102230246251565404236316680908203124", "0.30000000000000004", "1E0", "1e+0",
        "10000000000000000000000e-22", "0.0000000000000000000001e22", "123.456e-7", "-98765.4321E3",
        // integers at every length, and the int64 bounds
        "0", "-0", "7", "-7", "1000000000000000000", "-999999999999999999", "9223372036854775807",
        "-9223372036854775808", "4294967296", "-2147483649",
    ]

    @Test func numbersMatch() {
        var reals = 0
        for text in Self.numberCases {
            for document in [text, "[" + text + "]", "{\"n\":" + text + "}", " " + text + "\n"] {
                #expect(Self.agree(Self.u(document), maxDepth: 512) == true, "\(document)")
            }
            if let value = Self.built(Self.u(text), maxDepth: 512), value.type == JSON_REAL { reals += 1 }
        }
        #expect(reals == Self.numberCases.count - 10)  // all but the ten integers
        // The sign of zero is kept.
        let zero = Self.built(Self.u("-0.0"), maxDepth: 512)
        #expect(zero.map { json_real_value($0.pointer).sign } == .minus)
    }

    /// Strings: escapes of every kind, long ones (the decoding buffers grow past their
    /// space on the stack), keys with escapes, repeated keys.
    @Test func stringsAndKeysMatch() {
        let long = String(repeating: "ab\\n\\u00e9\\ud83d\\ude00", count: 60)  // over 256 bytes decoded
        let longKey = String(repeating: "k\\t", count: 100)  // over 128 bytes
        let cases: [String] = [
            #""""#, #""plain""#, #""\"\\\/\b\f\n\r\t""#, #""\u0000""#, #""a\u0000b""#, #""\u00e9\u00E9\uAbCd""#,
            #""\ud800\udc00\uDBFF\uDFFF""#, #""é😀日本語""#, #""x\u0041y""#, #""\u007f\u0080\u07ff\u0800\uffff""#,
            "\"" + long + "\"", "[\"" + long + "\",\"" + long + "\"]",
            "{\"" + longKey + "\":\"" + long + "\",\"" + longKey + "x\":[\"" + long + "\"]}",
            #"{"a":1,"b":2,"a":3}"#, #"{"a":{"x":1},"a":[2],"b":{"a":{}}}"#, #"{"a":1,"\u0061":2}"#,
            #"{"\u00e9":1,"é":2,"\"":{"\\":[]}}"#, #"{"a":[{"a":[{"a":"\u0061"}]}],"a":null}"#,
            String(repeating: #"{"k":"#, count: 100) + #""v""# + String(repeating: "}", count: 100),
            String(repeating: "[", count: 2048) + String(repeating: "]", count: 2048),
            String(repeating: #"[{"\n":"#, count: 40) + "true" + String(repeating: "}]", count: 40),
        ]
        for text in cases {
            #expect(Self.agree(Self.u(text), maxDepth: 1_000_000) == true, "\(text.prefix(80))")
        }
        // Repeated keys: the last value, in the first one's place (what jansson does).
        let repeated = Self.built(Self.u(#"{"a":1,"b":2,"a":3}"#), maxDepth: 512)
        #expect(repeated.map(Self.exactText) == #"{"a":3,"b":2}"#)
    }

    // MARK: - Random documents

    /// A random JSON text: nesting, strings with raw UTF-8 and every kind of escape,
    /// numbers of many shapes, repeated keys, random whitespace.
    static func randomDocument(_ rng: inout SplitMix, depth: Int = 0) -> String {
        func ws(_ rng: inout SplitMix) -> String { [" ", "", "", "\n", "\t", "\r\n "][rng.below(6)] }
        func digits(_ n: Int, _ rng: inout SplitMix) -> String {
            String((0..<n).map { _ in Character(String(rng.below(10))) })
        }
        func number(_ rng: inout SplitMix) -> String {
            let sign = rng.below(3) == 0 ? "-" : ""
            let lead = rng.below(4) == 0 ? "0" : String(1 + rng.below(9)) + digits(rng.below(20), &rng)
            var text = sign + lead
            if lead.count > 19 && rng.below(2) == 0 { text = sign + String(lead.prefix(18)) }  // keep int64 valid
            let shape = rng.below(4)
            if shape == 0 && text.count <= 19 { return text }  // an integer
            if shape != 1 { text += "." + digits(1 + rng.below(20), &rng) }
            if shape != 2 {
                let exp = rng.below(3) == 0 ? rng.below(400) : rng.below(30)
                text += ["e", "E"][rng.below(2)] + ["", "+", "-"][rng.below(3)] + String(exp)
            }
            if shape == 0 { text += "e0" }  // an integer too long for int64: make it a real
            return text
        }
        func string(_ rng: inout SplitMix) -> String {
            let pieces = [
                "a", "Z", " ", "é", "日本", "😀", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t",
                "\\u0041", "\\u00e9", "\\u0000", "\\u20AC", "\\uD83D\\uDE00", "\\udbff\\udfff", "\\u007F", "~",
            ]
            var text = "\""
            for _ in 0..<rng.below(rng.below(8) == 0 ? 120 : 8) { text += pieces[rng.below(pieces.count)] }
            return text + "\""
        }
        func key(_ rng: inout SplitMix) -> String {
            // Few distinct keys, so repeats are common; some escaped, none with \u0000.
            ["\"a\"", "\"b\"", "\"\\u0061\"", "\"id\"", "\"é\"", "\"\\n\"", "\"long key with spaces\""][rng.below(7)]
        }
        let kind = depth >= 6 ? 2 + rng.below(5) : rng.below(7)
        switch kind {
        case 0:
            let items = (0..<rng.below(6)).map { _ in ws(&rng) + randomDocument(&rng, depth: depth + 1) + ws(&rng) }
            return "[" + (items.isEmpty ? ws(&rng) : items.joined(separator: ",")) + "]"
        case 1:
            let members = (0..<rng.below(6)).map { _ in
                ws(&rng) + key(&rng) + ws(&rng) + ":" + ws(&rng) + randomDocument(&rng, depth: depth + 1) + ws(&rng)
            }
            return "{" + (members.isEmpty ? ws(&rng) : members.joined(separator: ",")) + "}"
        case 2, 3: return number(&rng)
        case 4: return string(&rng)
        default: return ["true", "false", "null"][rng.below(3)]
        }
    }

    @Test func randomDocumentsMatch() {
        var rng = SplitMix(seed: 0xB111_D0C5)
        var built = 0
        var mismatches = 0
        for _ in 0..<20_000 {
            let bytes = Self.u(Self.randomDocument(&rng))
            if !Self.tally(bytes, built: &built, mismatches: &mismatches) { break }
        }
        #expect(mismatches == 0)
        // Nearly all are valid (a real past 1e308 is not); both kinds occur.
        #expect(built > 15_000 && built < 20_000)
    }

    // MARK: - Mutation fuzz

    @Test func mutatedDocumentsMatch() throws {
        var seeds: [[UInt8]] = JSONValidatorTests.generatedSeeds.map { Self.u($0) }
        let directory = try JSONSuiteFiles.directory()
        for name in try JSONSuiteFiles.names() where name.hasPrefix("y_") {
            seeds.append(try #require(JSONSuiteFiles.read(directory + "/" + name)))
        }
        let alphabet = Self.u("\"\\[]{}:,-+.eE0123456789u/btnrf \t\n")
        var rng = SplitMix(seed: 0xB0_11DE_F00D)
        var accepted = 0
        var mismatches = 0
        for _ in 0..<30_000 {
            var bytes = seeds[rng.below(seeds.count)]
            for _ in 0..<(1 + rng.below(3)) {
                let position = rng.below(bytes.count + 1)
                let byte = rng.below(3) == 0 ? UInt8(rng.below(256)) : alphabet[rng.below(alphabet.count)]
                switch rng.below(4) {
                case 0 where position < bytes.count: bytes[position] = byte
                case 1: bytes.insert(byte, at: position)
                case 2 where position < bytes.count: bytes.remove(at: position)
                default:
                    let length = min(1 + rng.below(8), bytes.count - min(position, bytes.count))
                    bytes.insert(contentsOf: bytes[position..<(position + length)], at: position)
                }
            }
            if !Self.tally(bytes, built: &accepted, mismatches: &mismatches) { break }
        }
        #expect(mismatches == 0)
        #expect(accepted > 3_000)
        #expect(accepted < 27_000)
    }

    // MARK: - JSONParser.parse

    /// `parse` gives the builder's tree for valid input and jansson's error otherwise.
    @Test func parseUsesTheBuilderAndJanssonsErrors() throws {
        let text = #"{"results":[{"id":1,"score":64.281,"t":"a\u00e9"}],"n":-0.0}"#
        let value = try JSONParser.parse(text, maxDepth: 512)
        #expect(Self.exactText(value) == #"{"results":[{"id":1,"score":64.281000000000006,"t":"aé"}],"n":-0.0}"#)
        #expect(throws: JSONParseError.self) { try JSONParser.parse("[1,]", maxDepth: 512) }
        do {
            _ = try JSONParser.parse("[1,]", maxDepth: 512)
            Issue.record("[1,] parsed")
        } catch {
            #expect(error.kind == .syntax)
            #expect(error.position == 4)
        }
        do {
            _ = try JSONParser.parse("[[[1]]]", maxDepth: 2)
            Issue.record("[[[1]]] parsed at maxDepth 2")
        } catch {
            #expect(error.kind == .depth)
        }
    }
}
