; placement-logic proof obligation: claims/zeropp-vs-tp-1
; theorem: Claims: zeropp-vs-tp.place
; ZeroPP sends fewer bytes per step than Megatron-LM: holds ⇔ 614095200/64882781 < U (with stage = 4, intra = 8, inter = 2)
;   ∀ U > 0: (comm(zeropp) < comm(megatron)) ⇔ 614095200/64882781 < U (with stage = 4, intra = 8, inter = 2)
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun U () Real)
(assert
 (< 0.0 U))
(assert
 (and (distinct U 0.0) true))
(assert
 (and (distinct (> 61638119936.0 (+ 3503148160.0 (* 550229299200.0 (/ 1.0 U)))) (< (/ 614095200.0 64882781.0) U)) true))
(check-sat)
(exit)
