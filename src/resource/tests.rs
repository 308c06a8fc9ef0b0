//! Tests of what a resource guard claims while a conversion is in flight.

use super::*;
use LockMode::*;

#[test]
fn a_converting_holder_claims_what_both_modes_allow() {
    use super::guard::below_both;
    assert_eq!(below_both(Cw, Pr), Cr);
    assert_eq!(below_both(Pr, Cw), Cr);
    assert_eq!(below_both(Pr, Ex), Pr);
    assert_eq!(below_both(Cr, Pw), Cr);
    assert_eq!(below_both(Nl, Ex), Nl);
    assert_eq!(below_both(Cw, Ex), Cw);
    assert_eq!(below_both(Pw, Ex), Pw);
    for a in LockMode::ALL {
        assert_eq!(below_both(a, a), a);
    }
}
