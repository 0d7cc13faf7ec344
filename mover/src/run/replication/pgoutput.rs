//! The part of PostgreSQL's logical replication protocol (`pgoutput`, version 1) that says which
//! values a transaction writes: relations, the new rows of inserts and updates (and an update's
//! old key), each value in its text form, and where the transaction ends. `status` reads a stopped way back's next changes with it
//! (`pg_logical_slot_peek_binary_changes`), to name the value its subscriber cannot take.
//! Layout: PostgreSQL's "Logical Replication Message Formats".

use bytes::Buf;

/// A table, as the publisher describes it before its first change in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub id: u32,
    pub schema: String,
    pub table: String,
    /// Its columns' names, in the order of a row's values.
    pub columns: Vec<String>,
    /// Whether each column is part of the key the subscriber finds a row by (its replica
    /// identity: the primary key's columns, or every column with `REPLICA IDENTITY FULL`).
    pub key: Vec<bool>,
}

/// One value of a row: its text form, or none (NULL, or a TOASTed value the change left as it
/// was).
pub(crate) type Value = Option<String>;

/// A message of the stream, as far as the values it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    Relation(Relation),
    /// An insert's row, or an update's new row, of relation `relation`; an update's `old` key
    /// (or whole old row) when it sent one: the key changed, or the identity is `FULL`.
    Row {
        relation: u32,
        values: Vec<Value>,
        old: Option<Vec<Value>>,
    },
    /// The end of a transaction.
    Commit,
    /// Every other message (begin, delete, truncate, type, origin, logical message).
    Other,
}

/// What cannot be read as a message of protocol version 1 in text form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a pgoutput message cannot be read: {0}")]
pub(crate) struct Malformed(&'static str);

/// One message, as `pg_logical_slot_peek_binary_changes` returns it (one a row).
pub(crate) fn parse(mut m: &[u8]) -> Result<Message, Malformed> {
    let kind = take_u8(&mut m)?;
    match kind {
        b'R' => {
            let id = take_u32(&mut m)?;
            let schema = take_cstr(&mut m)?;
            let table = take_cstr(&mut m)?;
            take_u8(&mut m)?; // replica identity
            let count = take_u16(&mut m)?;
            let (mut columns, mut key) = (Vec::new(), Vec::new());
            for _ in 0..count {
                key.push(take_u8(&mut m)? & 1 == 1);
                columns.push(take_cstr(&mut m)?);
                take_u32(&mut m)?; // type OID
                take_u32(&mut m)?; // type modifier
            }
            Ok(Message::Relation(Relation {
                id,
                schema,
                table,
                columns,
                key,
            }))
        }
        b'I' => {
            let relation = take_u32(&mut m)?;
            expect(&mut m, b'N')?;
            Ok(Message::Row {
                relation,
                values: tuple(&mut m)?,
                old: None,
            })
        }
        b'U' => {
            let relation = take_u32(&mut m)?;
            let mut marker = take_u8(&mut m)?;
            let mut old = None;
            if marker == b'K' || marker == b'O' {
                old = Some(tuple(&mut m)?);
                marker = take_u8(&mut m)?;
            }
            if marker != b'N' {
                return Err(Malformed("an update without its new row"));
            }
            Ok(Message::Row {
                relation,
                values: tuple(&mut m)?,
                old,
            })
        }
        b'C' => Ok(Message::Commit),
        _ => Ok(Message::Other),
    }
}

fn tuple(m: &mut &[u8]) -> Result<Vec<Value>, Malformed> {
    let count = take_u16(m)?;
    let mut values = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        values.push(match take_u8(m)? {
            b'n' | b'u' => None,
            b't' => {
                let len = usize::try_from(take_u32(m)?).map_err(|_| Malformed("a length"))?;
                if m.remaining() < len {
                    return Err(Malformed("a value longer than its message"));
                }
                let text = String::from_utf8_lossy(&m[..len]).into_owned();
                m.advance(len);
                Some(text)
            }
            b'b' => return Err(Malformed("a value in binary form")),
            _ => return Err(Malformed("a value of an unknown kind")),
        });
    }
    Ok(values)
}

fn take_u8(m: &mut &[u8]) -> Result<u8, Malformed> {
    m.try_get_u8().map_err(|_| Malformed("a message cut short"))
}

fn take_u16(m: &mut &[u8]) -> Result<u16, Malformed> {
    m.try_get_u16()
        .map_err(|_| Malformed("a message cut short"))
}

fn take_u32(m: &mut &[u8]) -> Result<u32, Malformed> {
    m.try_get_u32()
        .map_err(|_| Malformed("a message cut short"))
}

fn expect(m: &mut &[u8], marker: u8) -> Result<(), Malformed> {
    if take_u8(m)? == marker {
        Ok(())
    } else {
        Err(Malformed("a row without its marker"))
    }
}

fn take_cstr(m: &mut &[u8]) -> Result<String, Malformed> {
    let end = m
        .iter()
        .position(|&b| b == 0)
        .ok_or(Malformed("a name without its end"))?;
    let text = String::from_utf8_lossy(&m[..end]).into_owned();
    m.advance(end + 1);
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation() -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(16_384_u32.to_be_bytes());
        m.extend(b"public\0invoices\0");
        m.push(b'd');
        m.extend(2_u16.to_be_bytes());
        for (name, oid) in [("tenant_id", 25_u32), ("period", 1186)] {
            m.push(1);
            m.extend(name.as_bytes());
            m.push(0);
            m.extend(oid.to_be_bytes());
            m.extend((-1_i32).to_be_bytes());
        }
        m
    }

    fn row(values: &[Option<&str>]) -> Vec<u8> {
        let mut m = (values.len() as u16).to_be_bytes().to_vec();
        for v in values {
            match v {
                Some(text) => {
                    m.push(b't');
                    m.extend((text.len() as u32).to_be_bytes());
                    m.extend(text.as_bytes());
                }
                None => m.push(b'n'),
            }
        }
        m
    }

    #[test]
    fn a_relation_names_its_columns() {
        let Message::Relation(r) = parse(&relation()).unwrap() else {
            panic!("not a relation");
        };
        assert_eq!(
            (r.id, r.schema.as_str(), r.table.as_str()),
            (16_384, "public", "invoices")
        );
        assert_eq!(r.columns, ["tenant_id", "period"]);
        assert_eq!(r.key, [true, true]);
    }

    #[test]
    fn inserts_and_updates_carry_their_new_rows_as_text() {
        let mut insert = vec![b'I'];
        insert.extend(16_384_u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(row(&[Some("t1"), Some("infinity")]));
        assert_eq!(
            parse(&insert).unwrap(),
            Message::Row {
                relation: 16_384,
                values: vec![Some("t1".into()), Some("infinity".into())],
                old: None,
            }
        );
        // An update with its old row first: the new one is what it writes.
        let mut update = vec![b'U'];
        update.extend(16_384_u32.to_be_bytes());
        update.push(b'O');
        update.extend(row(&[Some("t1"), None]));
        update.push(b'N');
        update.extend(row(&[Some("t1"), Some("-infinity")]));
        let Message::Row { values, old, .. } = parse(&update).unwrap() else {
            panic!("not a row");
        };
        assert_eq!(values, [Some("t1".into()), Some("-infinity".into())]);
        assert_eq!(old, Some(vec![Some("t1".into()), None]));
        assert_eq!(parse(b"B\0\0").unwrap(), Message::Other);
        assert_eq!(parse(b"C\0").unwrap(), Message::Commit);
    }

    #[test]
    fn a_message_cut_short_is_refused_not_read_past() {
        let whole = relation();
        for end in 1..whole.len() {
            assert!(parse(&whole[..end]).is_err(), "cut at {end}");
        }
        let mut insert = vec![b'I'];
        insert.extend(1_u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(1_u16.to_be_bytes());
        insert.push(b't');
        insert.extend(100_u32.to_be_bytes());
        insert.extend(b"short");
        assert!(parse(&insert).is_err());
    }
}
