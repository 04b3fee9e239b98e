; placement-logic proof obligation: claims/zero-abstract-2
; theorem: Claims: zero-abstract.place
; at 1.5x communication cost (ZeRO volume): holds ⇔ always
;   ∀ : (volume(zero3) / volume(dp) == 3 / 2) ⇔ always
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(assert
 (and (distinct (= (/ 3.0 2.0) (/ 3.0 2.0)) true) true))
(check-sat)
(exit)
