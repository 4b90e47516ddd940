import CJansson
import Glibc
import Testing

@testable import FetchQ

/// Runs nst/JSONTestSuite's parsing files (a pinned copy in `shared/data`) through
/// `JSONParser`: every `y_` must parse, every `n_` must fail, every `i_` must return.
@Suite struct JSONTestSuiteTests {
    /// The known jansson 2.14 limitation: valid JSON whose object key contains `\u0000`.
    /// jansson's parser rejects it even with JSON_ALLOW_NUL (json_error_null_byte_in_key),
    /// and we have no second parser. Asserted precisely so a fixed jansson shows up here.
    static let janssonRejectsValid: Set<String> = ["y_object_escaped_null_in_key.json"]

    /// The i_ files are run at two depth limits: one a server might use, and one above
    /// jansson's own limit so that jansson's depth check is exercised too.
    static let depthSettings = [512, 1_000_000]

    @Test func suiteIsPresentAndComplete() throws {
        let files = try JSONSuiteFiles.names()
        #expect(files.filter { $0.hasPrefix("y_") }.count == 95)
        #expect(files.filter { $0.hasPrefix("n_") }.count == 188)
        #expect(files.filter { $0.hasPrefix("i_") }.count == 35)
    }

    @Test(arguments: depthSettings) func everyYesFileParses(maxDepth: Int) throws {
        let directory = try JSONSuiteFiles.directory()
        var checked = 0
        for name in try JSONSuiteFiles.names() where name.hasPrefix("y_") {
            let bytes = try #require(JSONSuiteFiles.read(directory + "/" + name), "cannot read \(name)")
            do {
                let value = try JSONParser.parse(bytes, maxDepth: maxDepth)
                #expect(!Self.janssonRejectsValid.contains(name), "\(name) now parses")
                // The value survives a round trip through jansson's encoder.
                let again = try JSONParser.parse(value.dumps(), maxDepth: maxDepth)
                #expect(again.isEqual(to: value), "\(name) does not round-trip")
            } catch {
                if Self.janssonRejectsValid.contains(name) {
                    #expect(error.kind == .unsupported, "\(name): \(error)")
                    #expect(error.message.contains("NUL byte in object key"), "\(name)")
                } else {
                    Issue.record("\(name) should parse: \(error)")
                }
            }
            checked += 1
        }
        #expect(checked == 95)
    }

    @Test(arguments: depthSettings) func everyNoFileFails(maxDepth: Int) throws {
        let directory = try JSONSuiteFiles.directory()
        var checked = 0
        for name in try JSONSuiteFiles.names() where name.hasPrefix("n_") {
            let bytes = try #require(JSONSuiteFiles.read(directory + "/" + name), "cannot read \(name)")
            do {
                let value = try JSONParser.parse(bytes, maxDepth: maxDepth)
                Issue.record("\(name) should fail, parsed as \(value.dumps())")
            } catch {
                #expect(!error.message.isEmpty, "\(name) failed without a message")
                #expect(error.position >= 0, "\(name) failed without a position")
            }
            checked += 1
        }
        #expect(checked == 188)
    }

    @Test(arguments: depthSettings) func everyImplementationDefinedFileReturns(maxDepth: Int) throws {
        let directory = try JSONSuiteFiles.directory()
        var checked = 0
        for name in try JSONSuiteFiles.names() where name.hasPrefix("i_") {
            let bytes = try #require(JSONSuiteFiles.read(directory + "/" + name), "cannot read \(name)")
            do {
                let value = try JSONParser.parse(bytes, maxDepth: maxDepth)
                let again = try JSONParser.parse(value.dumps(), maxDepth: maxDepth)
                #expect(again.isEqual(to: value), "\(name) does not round-trip")
            } catch {
                #expect(!error.message.isEmpty, "\(name) failed without a message")
                #expect(error.kind != .empty, "\(name) is not empty")
            }
            checked += 1
        }
        #expect(checked == 35)
    }

    /// The two 100 000-deep n_ files are stopped by the pre-scan below jansson's limit and
    /// by jansson's own limit above it; both report `.depth`.
    @Test(arguments: depthSettings) func deepSuiteFilesAreDepthErrors(maxDepth: Int) throws {
        let directory = try JSONSuiteFiles.directory()
        for name in ["n_structure_100000_opening_arrays.json", "n_structure_open_array_object.json"] {
            let bytes = try #require(JSONSuiteFiles.read(directory + "/" + name), "cannot read \(name)")
            let error = #expect(throws: JSONParseError.self) {
                try JSONParser.parse(bytes, maxDepth: maxDepth)
            }
            #expect(error?.kind == .depth, "\(name)")
            if name.hasPrefix("n_structure_100000") {
                // The first "[" past the limit is reported, wherever the limit came from.
                let limit = min(maxDepth, JSONParser.janssonMaxDepth)
                #expect(error?.position == limit + 1)
                #expect(error?.column == limit + 1)
            }
        }
        let nested = try #require(JSONSuiteFiles.read(directory + "/i_structure_500_nested_arrays.json"))
        #expect(try JSONParser.parse(nested, maxDepth: 500).count == 1)
        let error = #expect(throws: JSONParseError.self) {
            try JSONParser.parse(nested, maxDepth: 499)
        }
        #expect(error?.kind == .depth)
    }
}

// MARK: - File helpers (no Foundation)

/// Locates and reads the JSONTestSuite files.
enum JSONSuiteFiles {

    /// `shared/data/JSONTestSuite/test_parsing`, found next to the package root (the nearest
    /// ancestor of this file that contains Package.swift). Throws if it is missing.
    static func directory(filePath: String = #filePath) throws -> String {
        var directory = filePath
        var root: String?
        while let slash = directory.lastIndex(of: "/") {
            directory = String(directory[..<slash])
            if access(directory + "/Package.swift", F_OK) == 0 {
                root = directory
                break
            }
        }
        let packageRoot = try #require(root, "no Package.swift above \(filePath)")
        let path = packageRoot + "/../shared/data/JSONTestSuite/test_parsing"
        var info = stat()
        let isDirectory = stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
        try #require(isDirectory, "JSONTestSuite directory missing: \(path)")
        return path
    }

    /// The `.json` file names in the suite directory, sorted.
    static func names() throws -> [String] { try jsonFiles(in: directory()) }

    /// Every `.json` file name in `path`, sorted.
    static func jsonFiles(in path: String) throws -> [String] {
        let dir = try #require(opendir(path), "cannot open \(path)")
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name.hasSuffix(".json") { names.append(name) }
        }
        return names.sorted()
    }

    /// The whole file, or nil if it cannot be read.
    static func read(_ path: String) -> [UInt8]? {
        guard let file = fopen(path, "rb") else { return nil }
        defer { fclose(file) }
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, file) }
            if n > 0 { result.append(contentsOf: chunk[..<n]) }
            if n < chunk.count { break }
        }
        return ferror(file) == 0 ? result : nil
    }
}
