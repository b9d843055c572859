//! A minimal writer for "stored" (uncompressed) ZIP archives.
//!
//! WHY not a zip crate: bundles are a few small text files, so compression buys little, and
//! ~100 lines avoid a dependency (and its compression backends) for every build.

/// DOS date 1980-01-01 (the ZIP epoch); a fixed timestamp keeps bundles reproducible.
const DOS_DATE: u16 = (1 << 5) | 1;
const DOS_TIME: u16 = 0;
/// General purpose flag bit 11: file names are UTF-8.
const FLAG_UTF8: u16 = 1 << 11;
const VERSION: u16 = 20;

/// Why an archive could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ZipError {
    /// Sizes or counts beyond classic (non-ZIP64) limits.
    #[error("archive too large")]
    TooLarge,
}

/// Build a stored ZIP archive of `(name, content)` entries, in order.
pub(crate) fn write_stored_zip(entries: &[(String, Vec<u8>)]) -> Result<Vec<u8>, ZipError> {
    let count = u16::try_from(entries.len()).map_err(|_| ZipError::TooLarge)?;
    let total: usize = entries
        .iter()
        .map(|(n, d)| 30 + 46 + 2 * n.len() + d.len())
        .sum();
    let mut out = Vec::with_capacity(total + 22);
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = u32::try_from(out.len()).map_err(|_| ZipError::TooLarge)?;
        let size = u32::try_from(data.len()).map_err(|_| ZipError::TooLarge)?;
        let name_len = u16::try_from(name.len()).map_err(|_| ZipError::TooLarge)?;
        let crc = crc32(data);

        put32(&mut out, 0x0403_4b50);
        put16(&mut out, VERSION);
        put16(&mut out, FLAG_UTF8);
        put16(&mut out, 0); // method: stored
        put16(&mut out, DOS_TIME);
        put16(&mut out, DOS_DATE);
        put32(&mut out, crc);
        put32(&mut out, size); // compressed
        put32(&mut out, size); // uncompressed
        put16(&mut out, name_len);
        put16(&mut out, 0); // extra length
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);

        put32(&mut central, 0x0201_4b50);
        put16(&mut central, VERSION); // made by
        put16(&mut central, VERSION); // needed
        put16(&mut central, FLAG_UTF8);
        put16(&mut central, 0);
        put16(&mut central, DOS_TIME);
        put16(&mut central, DOS_DATE);
        put32(&mut central, crc);
        put32(&mut central, size);
        put32(&mut central, size);
        put16(&mut central, name_len);
        put16(&mut central, 0); // extra length
        put16(&mut central, 0); // comment length
        put16(&mut central, 0); // disk number start
        put16(&mut central, 0); // internal attributes
        put32(&mut central, 0); // external attributes
        put32(&mut central, offset);
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = u32::try_from(out.len()).map_err(|_| ZipError::TooLarge)?;
    let cd_size = u32::try_from(central.len()).map_err(|_| ZipError::TooLarge)?;
    out.extend_from_slice(&central);
    put32(&mut out, 0x0605_4b50);
    put16(&mut out, 0); // this disk
    put16(&mut out, 0); // disk with central directory
    put16(&mut out, count);
    put16(&mut out, count);
    put32(&mut out, cd_size);
    put32(&mut out, cd_offset);
    put16(&mut out, 0); // comment length
    Ok(out)
}

fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 (IEEE 802.3), as ZIP requires.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |c, &b| {
        CRC_TABLE[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_known_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }
}
